#!/usr/bin/python3
"""Reads the checkpoint that direct_engine_test's KeepForReaders saved with
the direct data path, with h5py and with h5dump, and compares every array's
bytes with the expected bytes it left next to it (expected/NAME.bin, '/' in
NAME as '.'). Exit 77 (skipped) without h5py or h5dump, or where DIR's file
system refuses O_DIRECT (the direct path then wrote through the page cache).

    /usr/bin/python3 direct_read_test.py DIR [H5DUMP]
"""
import errno
import glob
import json
import mmap
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:
    print("SKIPPED: %s" % e)
    sys.exit(77)


def direct_io_refused(directory):
    """Empty if a file created under `directory` opens with O_DIRECT and takes
    one aligned page written through it; else why not (as tests/direct_probe.h)."""
    path = os.path.join(directory, ".mhckpt-direct-probe-%d" % os.getpid())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        try:
            page = mmap.mmap(-1, 4096)  # page-aligned memory
            page.write(b"Z" * 4096)
            if os.pwrite(fd, page, 0) != 4096:
                return "an aligned write was cut short"
        finally:
            os.close(fd)
    except OSError as e:
        return "%s (%s)" % (e.strerror, errno.errorcode.get(e.errno, e.errno))
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return ""


def main():
    root = sys.argv[1]
    h5dump = sys.argv[2] if len(sys.argv) > 2 and os.path.exists(sys.argv[2]) else None
    if h5dump is None:
        print("SKIPPED: no h5dump")
        sys.exit(77)
    refused = direct_io_refused(root)
    if refused:
        print("SKIPPED: the file system under %s refuses O_DIRECT: %s" % (root, refused))
        sys.exit(77)
    steps = sorted(glob.glob(os.path.join(root, "step_*")))
    assert len(steps) == 1, steps
    with open(os.path.join(steps[0], "commit.json")) as f:
        marker = json.load(f)
    path = os.path.join(steps[0], marker["data_file"])
    names = [a["name"] for a in marker["arrays"]]
    assert len(names) == 10, names
    failures = []
    with h5py.File(path, "r") as f, tempfile.TemporaryDirectory() as tmp:
        for name in names:
            with open(os.path.join(root, "expected", name.replace("/", ".") + ".bin"), "rb") as e:
                want = e.read()
            d = f[name]
            got = np.ascontiguousarray(d[()]).tobytes()
            if got != want:
                failures.append("h5py: %s differs (%d vs %d bytes)" % (name, len(got), len(want)))
            if d.size == 0:
                continue  # h5dump writes no binary file for an empty dataset
            out = os.path.join(tmp, "out.bin")
            subprocess.run([h5dump, "-b", "FILE", "-d", "/" + name, "-o", out, path],
                           check=True, stdout=subprocess.DEVNULL)
            with open(out, "rb") as o:
                dumped = o.read()
            if dumped != want:
                failures.append("h5dump: %s differs (%d vs %d bytes)" % (name, len(dumped), len(want)))
    for line in failures:
        print(line)
    if failures:
        sys.exit(1)
    print("h5py and h5dump read %d arrays of %s equal to the saved bytes" % (len(names), path))


if __name__ == "__main__":
    main()
