#!/usr/bin/python3
"""Reads a checkpoint written by known_values_save with h5py alone and checks
every value, bfloat16 and float8 included (storage conventions: io/h5_file.cc).

    /usr/bin/python3 h5py_read_test.py DIR WORLD_SIZE [--replayed]

With --replayed: steps 41 to 45 of known_values_save --replay, whose files
rank 0 wrote by layout replay after the first (DIR/layout_replays says how
many times).
"""
import json
import math
import os
import sys

import h5py
import numpy as np

import step_files


def bfloat16_to_float32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def decode_float8(bits, exponent_bits, mantissa_bits, bias):
    """Normal and subnormal values of a float8 format (no inf/nan handling)."""
    out = []
    for b in bits.tolist():
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> mantissa_bits) & ((1 << exponent_bits) - 1)
        m = b & ((1 << mantissa_bits) - 1)
        if e == 0:
            out.append(sign * m / (1 << mantissa_bits) * 2.0 ** (1 - bias))
        else:
            out.append(sign * (1 + m / (1 << mantissa_bits)) * 2.0 ** (e - bias))
    return out


def dtype_attribute(dataset):
    value = dataset.attrs.get("mhckpt_dtype")
    return value.decode() if isinstance(value, bytes) else value


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def check_subfiles(root, step, marker):
    """Every box's bytes lie row-major at the place its index record gives in
    its subfile, and equal that box of the array read through data.h5."""
    step_dir = step_files.step_dir(root, step)
    names = sorted(n for n in os.listdir(step_dir) if n.startswith("data-"))
    check(names == ["data-%05d.h5" % i for i in range(marker["files"])],
          "subfiles %s for %d" % (names, marker["files"]))
    with h5py.File(os.path.join(step_dir, marker["data_file"]), "r") as f:
        for a in marker["arrays"]:
            stored = f[a["name"]]
            check(stored.is_virtual, "%s is a virtual dataset" % a["name"])
            whole = stored[()]
            for r in step_files.index_records(marker):
                if r["array"] != a["name"]:
                    continue
                b = r["box"]
                count = math.prod(b["count"])
                if count == 0:
                    continue
                path, offset = step_files.read_place(root, step, r)
                with open(path, "rb") as sub:
                    sub.seek(offset)
                    raw = sub.read(count * stored.dtype.itemsize)
                got = np.frombuffer(raw, dtype=stored.dtype).reshape(b["count"])
                want = whole[tuple(slice(s, s + c) for s, c in zip(b["start"], b["count"]))]
                np.testing.assert_array_equal(got, want)


def check_step(root, step, world_size):
    step_dir = os.path.join(root, "step_%010d" % step)
    with open(os.path.join(step_dir, "commit.json")) as f:
        marker = json.load(f)
    check(marker["format"] == "mhckpt", "marker format")
    check(marker["step"] == step, "marker step %r" % marker["step"])
    check(marker["world_size"] == world_size, "world size %r" % marker["world_size"])
    check(marker["user_metadata"] == {"test": "known_values", "step": str(step)},
          "user metadata %r" % marker["user_metadata"])
    by_name = {a["name"]: a for a in marker["arrays"]}
    boxes = {a["name"]: step_files.boxes(a) for a in marker["arrays"]}
    if marker["format_version"] >= 3:
        # The index beside the data: its size follows from the marker's boxes.
        index = step_files.index_path(root, step)
        check(marker["index"]["file"] == "index.bin", "index file %r" % marker["index"]["file"])
        check(os.path.getsize(index) == marker["index"]["bytes"] == step_files.index_bytes(marker),
              "index of %d bytes, marker says %d, its boxes %d"
              % (os.path.getsize(index), marker["index"]["bytes"], step_files.index_bytes(marker)))
        check(step_files.read_index_header(root, step) == (step_files.INDEX_MAGIC, step), "index header")
        for a in marker["arrays"]:
            check("checksum" not in json.dumps(a), "%s: no checksum in a format-3 marker" % a["name"])
        if marker.get("files", 0) > 0:
            check_subfiles(root, step, marker)

    with h5py.File(os.path.join(step_dir, marker["data_file"]), "r") as f:
        datasets = set()
        f.visititems(lambda name, obj: datasets.add(name) if isinstance(obj, h5py.Dataset) else None)
        check(datasets == set(by_name), "datasets %s != marker arrays %s" % (sorted(datasets), sorted(by_name)))
        for name, a in by_name.items():
            check(list(f[name].shape) == a["shape"], "%s: shape %s vs %s" % (name, f[name].shape, a["shape"]))
            covered = sum(math.prod(b["count"]) for b in boxes[name])
            check(covered == math.prod(a["shape"]), "%s: boxes cover %d elements" % (name, covered))

        d = f["values/f32_arange"]
        check(d.dtype == np.float32, "f32 dtype %s" % d.dtype)
        np.testing.assert_array_equal(d[()], (step * 1000 + np.arange(35, dtype=np.float32)).reshape(7, 5))
        check(len(boxes["values/f32_arange"]) == world_size, "f32 boxes: one per rank")
        check(sorted(b["writer"] for b in boxes["values/f32_arange"]) == list(range(world_size)),
              "f32 boxes: each by its rank")

        d = f["values/bf16"]
        check(d.dtype == np.uint16, "bf16 stored as %s" % d.dtype)
        check(dtype_attribute(d) == "bfloat16", "bf16 attribute %r" % dtype_attribute(d))
        np.testing.assert_array_equal(bfloat16_to_float32(d[()]),
                                      np.array([1.5, -2.0, 3.140625, 0.0, np.inf, -1.0], np.float32))

        d = f["values/f16"]
        check(d.dtype == np.float16, "f16 dtype %s" % d.dtype)
        check(dtype_attribute(d) is None, "f16 needs no attribute")
        np.testing.assert_array_equal(d[()], np.array([0.5, -1.25, 65504, 2.0 ** -14], np.float16))

        d = f["values/i64"]
        check(d.dtype == np.int64, "i64 dtype %s" % d.dtype)
        np.testing.assert_array_equal(d[()], np.array([-1, 0, 2 ** 40 + 3, -2 ** 63, 2 ** 63 - 1], np.int64))

        d = f["values/bool"]
        check(d.dtype == np.bool_, "bool read as %s (an int8 enum FALSE/TRUE reads as bool)" % d.dtype)
        np.testing.assert_array_equal(d[()], np.arange(9) % 3 == 0)

        d = f["values/u64"]
        check(d.dtype == np.uint64, "u64 dtype %s" % d.dtype)
        np.testing.assert_array_equal(d[()], np.array([0, 2 ** 63 + 5, 2 ** 64 - 1], np.uint64))

        d = f["values/f64_cols"]
        expect = np.array([[10.0 * i + j + 0.25 for j in range(4)] for i in range(3)])
        np.testing.assert_array_equal(d[()], expect)
        for b in boxes["values/f64_cols"]:
            check(b["start"][0] == 0 and b["count"][0] == 3, "f64_cols saved by columns: %r" % b)

        d = f["values/f8_e4m3"]
        check(d.dtype == np.uint8 and dtype_attribute(d) == "float8_e4m3fn", "f8_e4m3 storage")
        check(decode_float8(d[()], 4, 3, 7) == [1.0, -2.0, 448.0], "f8_e4m3 values %r" % d[()])
        d = f["values/f8_e5m2"]
        check(d.dtype == np.uint8 and dtype_attribute(d) == "float8_e5m2", "f8_e5m2 storage")
        check(decode_float8(d[()], 5, 2, 15) == [1.0, -2.0], "f8_e5m2 values %r" % d[()])

        d = f["scalar/step"]
        check(d.shape == () and d.dtype == np.int64 and d[()] == step, "scalar step %r" % d[()])
        check(by_name["scalar/step"]["replicated"], "the scalar is replicated")

        d = f["nested/deep/path/i32"]
        np.testing.assert_array_equal(d[()], -np.arange(24, dtype=np.int32).reshape(2, 3, 4))


def main():
    root, world_size = sys.argv[1], int(sys.argv[2])
    steps = (41, 42)
    if sys.argv[3:] == ["--replayed"]:
        # known_values_save --replay: steps 41 to 45, the last four written
        # by layout replay (io/direct_engine.h), which it counted.
        steps = (41, 42, 43, 44, 45)
        with open(os.path.join(root, "layout_replays")) as f:
            replays = int(f.read())
        # With subfiles, rank 0 replays two layouts per save: its subfile's and data.h5's.
        with open(os.path.join(root, "step_%010d" % steps[-1], "commit.json")) as f:
            per_save = 2 if json.load(f).get("files", 0) > 0 else 1
        want = per_save * (len(steps) - 1)
        check(replays == want, "layout replayed %d times, not %d" % (replays, want))
    for step in steps:
        check_step(root, step, world_size)
    print("h5py read every array of steps %s in %s: values match" % (", ".join(map(str, steps)), root))


if __name__ == "__main__":
    main()
