"""``python -m mhckpt COMMAND``: ``convert SRC DST`` (see mhckpt/_convert.py).

Run it under mpirun at any process count: ``mpirun -np 4 python -m mhckpt
convert /orbax/run1/1000 /ckpt/run1``.
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "convert":
        from ._convert import main as convert
        from ._errors import Error

        try:
            return convert(rest)
        except (Error, OSError, ImportError) as e:
            # The same on every rank (a failed read is agreed before the save).
            print(f"python -m mhckpt convert: {e}", file=sys.stderr, flush=True)
            return 1
    print(f"python -m mhckpt: unknown command {command!r} (commands: convert)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
