#!/usr/bin/python3
"""Runs the mhckpt CLI on a checkpoint saved by known_values_save (at 3 ranks)
and on damaged copies of it. --fixture is saved at the default format (3:
checksums in index.bin), --fixture-v2 at format 2 (checksums in the marker).

    cli_test.py CASE --mhckpt BIN --fixture DIR --fixture-v2 DIR --work DIR [--mpiexec "mpiexec -n 2 ..."]

CASE is one of: list, list_local, inspect, verify_damage, gc.
"""
import argparse
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import h5py

import step_files
from step_files import read_marker, step_dir

FIXTURE_WORLD_SIZE = 3


def check(condition, what):
    if not condition:
        raise AssertionError(what)


class Cli:
    def __init__(self, binary, mpiexec):
        self.binary = binary
        self.mpiexec = shlex.split(mpiexec) if mpiexec else []

    def run(self, *args, mpi=False):
        cmd = (self.mpiexec if mpi else []) + [self.binary] + [str(a) for a in args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        print("$ %s  -> %d" % (" ".join(cmd), p.returncode))
        print(p.stdout + p.stderr)
        return p.returncode, p.stdout + p.stderr

    def ok(self, *args, mpi=False):
        rc, out = self.run(*args, mpi=mpi)
        check(rc == 0, "expected success: %s" % " ".join(map(str, args)))
        return out

    def fails(self, *args, mpi=False):
        rc, out = self.run(*args, mpi=mpi)
        check(rc != 0, "expected failure: %s" % " ".join(map(str, args)))
        return out


def fresh_copy(fixture, work, name):
    dest = os.path.join(work, name)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(fixture, dest)
    return dest


def add_uncommitted(root):
    """A crashed save (data, no marker) at step 10 and one in progress at 99."""
    os.makedirs(step_dir(root, 10))
    with open(os.path.join(step_dir(root, 10), "data.h5"), "wb") as f:
        f.write(b"\0" * 1000)
    os.makedirs(step_dir(root, 99))
    with open(os.path.join(step_dir(root, 99), "commit.json.tmp"), "w") as f:
        f.write("{")


def case_list(cli, fixture, fixture_v2, work):
    root = fresh_copy(fixture, work, "list")
    add_uncommitted(root)
    listing = json.loads(cli.ok("list", root, "--json"))
    steps = {s["step"]: s for s in listing["steps"]}
    check(sorted(steps) == [10, 41, 42, 99], "steps %s" % sorted(steps))
    check([s["step"] for s in listing["steps"]] == [10, 41, 42, 99], "ascending")
    for step in (41, 42):
        s, m = steps[step], read_marker(root, step)
        check(s["committed"] and s["state"] == "committed", "step %d committed" % step)
        check(s["world_size"] == FIXTURE_WORLD_SIZE, "world size %r" % s["world_size"])
        check(s["created_unix_ms"] == m["created_unix_ms"], "creation time from the marker")
        check(abs(s["created_unix_ms"] / 1000 - time.time()) < 3600, "created within the hour")
        check(s["arrays"] == len(m["arrays"]) == 11, "array count %r" % s["arrays"])
        check(s["array_bytes"] == m["total_bytes"], "array bytes")
        data = os.path.getsize(os.path.join(step_dir(root, step), "data.h5"))
        check(s["bytes_on_disk"] >= data + 1, "bytes on disk %d vs data.h5 %d" % (s["bytes_on_disk"], data))
        check(s["error"] is None, "no error")
    for step in (10, 99):
        s = steps[step]
        check(not s["committed"] and s["state"] == "uncommitted", "step %d uncommitted" % step)
        check(s["world_size"] is None and s["created_unix_ms"] is None, "no marker facts")
    check(steps[10]["bytes_on_disk"] == 1000, "uncommitted size %r" % steps[10]["bytes_on_disk"])

    text = cli.ok("list", root)
    check("4 steps, 2 committed" in text, "table header")
    check(any(l.split()[:2] == ["42", "committed"] and str(FIXTURE_WORLD_SIZE) in l.split() for l in text.splitlines()),
          "table row of step 42")
    out = cli.fails("list", os.path.join(work, "no_such_root"))
    check("no checkpoint root" in out, "missing root is named")


def writer_bytes(marker):
    """Bytes of each writer's file of a local step (its boxes back to back)."""
    sizes = [0] * marker["world_size"]
    for a in marker["arrays"]:
        for b in step_files.boxes(a):
            n = step_files.DTYPE_BYTES[a["dtype"]]
            for c in b["count"]:
                n *= c
            sizes[b["writer"]] += n
    return sizes


def case_list_local(cli, fixture, fixture_v2, work):
    """--local-dir: a node's local tier, made from the fixture's steps: step 41
    with the files of ranks 0 and 2 whole, step 42 with rank 1's cut short."""
    root = fresh_copy(fixture, work, "list_local")
    local = fresh_copy(fixture, work, "list_local_node")
    for step, whole in ((41, [0, 2]), (42, [0, 2])):
        os.remove(os.path.join(step_dir(local, step), "data.h5"))
        sizes = writer_bytes(read_marker(local, step))
        for w, n in enumerate(sizes):
            if w in whole or step == 42:
                with open(os.path.join(step_dir(local, step), "w%d.bin" % w), "wb") as f:
                    f.write(b"\0" * (n if w in whole else max(n - 1, 0)))
    listing = json.loads(cli.ok("list", root, "--local-dir", local, "--json"))
    steps = {s["step"]: s for s in listing["local"]["steps"]}
    check(sorted(steps) == [41, 42], "local steps %s" % sorted(steps))
    check(steps[41]["files_of_ranks"] == [0, 2], "files of step 41: %r" % steps[41]["files_of_ranks"])
    check(steps[42]["files_of_ranks"] == [0, 2], "a short file is not held: %r" % steps[42]["files_of_ranks"])
    check(steps[41]["state"] == "committed" and steps[41]["world_size"] == FIXTURE_WORLD_SIZE, "local step 41")
    text = cli.ok("list", root, "--local-dir", local)
    check("(this node's local tier): 2 steps" in text, "local section header")
    check(any(l.split() == ["41", "committed", str(FIXTURE_WORLD_SIZE), "0,2"] for l in text.splitlines()),
          "local row of step 41")


def case_inspect(cli, fixture, fixture_v2, work):
    root = fixture  # read-only
    info = json.loads(cli.ok("inspect", root, "--json"))
    check(info["step"] == 42, "default is the newest committed step, got %r" % info["step"])
    check(info["format_version"] == 3, "format version %r" % info["format_version"])
    check(info["world_size"] == FIXTURE_WORLD_SIZE, "world size")
    check(info["user_metadata"] == {"test": "known_values", "step": "42"}, "metadata %r" % info["user_metadata"])
    check(info["data_file"].endswith("step_0000000042/data.h5"), "data file")
    marker = read_marker(root, 42)
    check([a["name"] for a in info["arrays"]] == [a["name"] for a in marker["arrays"]], "array names")
    arrays = {a["name"]: a for a in info["arrays"]}
    f32 = arrays["values/f32_arange"]
    check(f32["dtype"] == "float32" and f32["shape"] == [7, 5] and not f32["replicated"], "f32 array")
    check(f32["bytes"] == 140, "f32 bytes")
    check([{k: b[k] for k in ("start", "count", "writer")} for b in f32["boxes"]] ==
          [{"start": [0, 0], "count": [3, 5], "writer": 0},
           {"start": [3, 0], "count": [2, 5], "writer": 1},
           {"start": [5, 0], "count": [2, 5], "writer": 2}], "f32 boxes %r" % f32["boxes"])
    # Every box as the marker's grid or list has it, with the checksum its
    # index record holds (read here without mhckpt).
    for a in marker["arrays"]:
        listed = arrays[a["name"]]["boxes"]
        check([{k: b[k] for k in ("start", "count", "writer")} for b in listed] ==
              [{k: b[k] for k in ("start", "count", "writer")} for b in step_files.boxes(a)],
              "%s: boxes as in the marker: %r" % (a["name"], listed))
        for k, b in enumerate(listed):
            record = step_files.record_of(marker, a["name"], k)
            checksum, chunks = step_files.read_record(root, 42, record)
            check(b["checksum"] == step_files.checksum_string(checksum) and checksum != 0,
                  "%s box %d: checksum %s, the index has %s"
                  % (a["name"], k, b["checksum"], step_files.checksum_string(checksum)))
            check(len(chunks) >= 1, "%s box %d: chunk checksums in the index" % (a["name"], k))
    # The same arrays saved at format 2: the same boxes and checksums, there
    # from the marker.
    info_v2 = json.loads(cli.ok("inspect", fixture_v2, "--json"))
    check(info_v2["format_version"] == 2, "format 2 fixture: version %r" % info_v2["format_version"])
    check(info_v2["arrays"] == info["arrays"], "format 2 and 3 inspect the same arrays, boxes and checksums")
    marker_v2 = read_marker(fixture_v2, 42)
    check([b["checksum"] for b in f32["boxes"]] ==
          [b["checksum"] for a in marker_v2["arrays"] if a["name"] == "values/f32_arange" for b in a["boxes"]],
          "checksums as in the format-2 marker")
    cols = arrays["values/f64_cols"]
    check([b["count"] for b in cols["boxes"]] == [[3, 2], [3, 1], [3, 1]], "column boxes %r" % cols["boxes"])
    bf16 = arrays["values/bf16"]
    check(bf16["dtype"] == "bfloat16" and bf16["bytes"] == 12, "bf16")
    u64 = arrays["values/u64"]
    check(u64["replicated"] and [(b["start"], b["count"], b["writer"]) for b in u64["boxes"]] == [([0], [3], 0)],
          "replica written by rank 0")
    step = arrays["scalar/step"]
    check(step["shape"] == [] and step["dtype"] == "int64", "0-d array")
    nested = arrays["nested/deep/path/i32"]
    check(len(nested["boxes"]) == 2, "a rank without rows writes no box: %r" % nested["boxes"])

    older = json.loads(cli.ok("inspect", root, "--step", 41, "--json"))
    check(older["step"] == 41 and older["user_metadata"]["step"] == "41", "--step 41")
    out = cli.fails("inspect", root, "--step", 7)
    check("step 7 is not committed" in out, "uncommitted step is named")
    text = cli.ok("inspect", root)
    check("values/f32_arange" in text and "[0:3, 0:5] (rank 0)" in text and "test = known_values" in text,
          "text output lists arrays, boxes with writers, and metadata")


def case_verify_damage(cli, fixture, fixture_v2, work):
    good = fresh_copy(fixture, work, "good")
    out = cli.ok("verify", good, "--all")
    check("verified 2 steps" in out and "OK (structure, readability and checksums)" in out,
          "a good checkpoint verifies")
    out = cli.ok("verify", good, mpi=True)
    check("read by 2 ranks" in out, "verify splits the reads under mpiexec")

    # A dataset deleted with h5py.
    root = fresh_copy(fixture, work, "deleted_dataset")
    with h5py.File(os.path.join(step_dir(root, 42), "data.h5"), "r+") as f:
        del f["values/bf16"]
    for mpi in (False, True):
        out = cli.fails("verify", root, mpi=mpi)
        check("array 'values/bf16': dataset missing" in out, "the missing dataset is named")
    cli.ok("verify", root, "--step", 41)  # the other step is intact

    # One value of the data changed in place (the file stays well-formed).
    root = fresh_copy(fixture, work, "flipped_value")
    with h5py.File(os.path.join(step_dir(root, 42), "data.h5"), "r+") as f:
        f["values/f32_arange"][6, 4] = 12345.0
    for mpi in (False, True):
        out = cli.fails("verify", root, mpi=mpi)
        check("array 'values/f32_arange' box [5:7, 0:5] chunk 0 (rows 5..7): "
              "checksum mismatch" in out and "(written by rank 2)" in out, "the damaged box and its writer are named")
    cli.ok("verify", root, "--step", 41)

    # The shape of values/i64 changed from [5] to [6] in the marker. Its
    # grid listed as boxes: the boxes no longer cover the array.
    root = fresh_copy(fixture, work, "marker_shape")
    marker = read_marker(root, 41)
    i64 = [k for k, a in enumerate(marker["arrays"]) if a["name"] == "values/i64"][0]
    check(marker["arrays"][i64]["grid"] == [[0, 2, 4, 5]] and marker["arrays"][i64]["writers"] == [0, 1, 2],
          "values/i64 is a grid of 3 cells: %r" % marker["arrays"][i64])
    marker["arrays"][i64] = step_files.grid_as_boxes(marker["arrays"][i64])
    marker["arrays"][i64]["shape"] = [6]
    step_files.write_marker(root, 41, marker)
    out = cli.fails("verify", root, "--step", 41)
    check("array 'values/i64' of shape [6]: the boxes of all ranks cover 5 of 6 elements" in out,
          "tiling problem named")
    check("array 'values/i64': stored shape does not match" in out, "shape mismatch named")
    cli.ok("verify", root, "--step", 42)
    # As a grid: its cuts no longer end at the shape.
    marker = read_marker(fixture, 41)
    marker["arrays"][i64]["shape"] = [6]
    step_files.write_marker(root, 41, marker)
    out = cli.fails("verify", root, "--step", 41)
    check("array 'values/i64': the grid's cuts of dimension 0 do not rise from 0 to 6" in out,
          "grid problem named")
    # A grid whose writers are one too many.
    marker = read_marker(fixture, 41)
    marker["arrays"][i64]["writers"].append(1)
    step_files.write_marker(root, 41, marker)
    out = cli.fails("verify", root, "--step", 41)
    check("array 'values/i64': a grid of 3 cells with 4 writers" in out, "writers problem named")

    # One byte of a marker changed so that it no longer parses.
    root = fresh_copy(fixture, work, "marker_broken")
    path = os.path.join(step_dir(root, 42), "commit.json")
    data = bytearray(open(path, "rb").read())
    data[0:1] = b"["
    open(path, "wb").write(bytes(data))
    out = cli.fails("verify", root)
    check("invalid commit marker: step 42" in out, "a damaged marker is reported without --step")
    out = cli.fails("verify", root, "--step", 42)
    check("malformed" in out, "and with --step")
    listing = json.loads(cli.ok("list", root, "--json"))
    check([s["state"] for s in listing["steps"]] == ["committed", "invalid_marker"], "list shows it")

    # A truncated data file.
    root = fresh_copy(fixture, work, "truncated")
    path = os.path.join(step_dir(root, 42), "data.h5")
    os.truncate(path, os.path.getsize(path) // 2)
    out = cli.fails("verify", root, mpi=True)
    check("step 42: data file:" in out and "truncated" in out, "truncation reported")

    # Format 3: damage to index.bin (verify reads every record).
    marker = read_marker(fixture, 42)
    record = step_files.record_of(marker, "values/f32_arange", 2)
    box = "array 'values/f32_arange' box [5:7, 0:5] (written by rank 2)"
    check(step_files.box_string(record["box"]) == "[5:7, 0:5]", "f32 box 2 is %r" % record["box"])
    for name, at in (("checksum", 0), ("chunk", 8), ("check_word", record["bytes"] - 1)):
        root = fresh_copy(fixture, work, "index_" + name)
        index = step_files.index_path(root, 42)
        step_files.flip_byte(index, record["offset"] + at)
        for mpi in ((False, True) if name == "checksum" else (False,)):
            out = cli.fails("verify", root, mpi=mpi)
            check("index '%s': the record of %s fails its check" % (index, box) in out,
                  "a flipped %s byte of the index names it, the array and the box" % name)
    cli.ok("verify", root, "--step", 41)
    out = cli.fails("inspect", root, "--json")
    check("index '%s'" % index in out, "inspect needs the index too")

    root = fresh_copy(fixture, work, "index_truncated")
    index = step_files.index_path(root, 42)
    size = os.path.getsize(index)
    os.truncate(index, size - 8)
    out = cli.fails("verify", root, mpi=True)
    check("index '%s' is %d bytes; the commit marker says %d" % (index, size - 8, size) in out,
          "a truncated index is named with both sizes")
    cli.ok("verify", root, "--step", 41)

    root = fresh_copy(fixture, work, "index_missing")
    index = step_files.index_path(root, 42)
    os.remove(index)
    for mpi in (False, True):
        out = cli.fails("verify", root, mpi=mpi)
        check("index '%s' is missing" % index in out, "a missing index is named")

    # A record of step 41 in step 42's index: it passes its own check (the
    # same array and box), but not the marker's index checksum, nor the data.
    root = fresh_copy(fixture, work, "index_other_step")
    index = step_files.index_path(root, 42)
    with open(step_files.index_path(root, 41), "rb") as f:
        f.seek(record["offset"])
        other = f.read(record["bytes"])
    with open(index, "r+b") as f:
        f.seek(record["offset"])
        f.write(other)
    out = cli.fails("verify", root)
    check("index '%s': its records' checksum is" % index in out, "the index checksum names the index")

    # The index size the marker records.
    root = fresh_copy(fixture, work, "index_bytes")
    marker = read_marker(root, 42)
    marker["index"]["bytes"] += 8
    step_files.write_marker(root, 42, marker)
    out = cli.fails("verify", root, "--step", 42)
    check("the index is %d bytes, but its boxes' records take %d"
          % (marker["index"]["bytes"], marker["index"]["bytes"] - 8) in out, "index size named")

    # Format 2: a checksum forged in the marker (the chunk's agreeing).
    root = fresh_copy(fixture_v2, work, "v2_forged_checksum")
    check(not os.path.exists(step_files.index_path(root, 42)), "a format-2 step has no index")
    cli.ok("verify", root, "--all")
    marker = read_marker(root, 42)
    check(marker["format_version"] == 2, "format 2 fixture")
    f32 = [a for a in marker["arrays"] if a["name"] == "values/f32_arange"][0]
    f32["boxes"][2]["checksum"] = "xxh3:%016x" % (int(f32["boxes"][2]["checksum"][5:], 16) ^ 1)
    step_files.write_marker(root, 42, marker)
    for mpi in (False, True):
        out = cli.fails("verify", root, mpi=mpi)
        check("array 'values/f32_arange' box [5:7, 0:5]" in out and "checksum mismatch" in out,
              "a forged checksum in a format-2 marker is named")
    cli.ok("verify", root, "--step", 41)
    # and a forged chunk checksum
    marker = read_marker(fixture_v2, 42)
    f32 = [a for a in marker["arrays"] if a["name"] == "values/f32_arange"][0]
    f32["boxes"][2]["chunks"][0] = "xxh3:0000000000000000"
    step_files.write_marker(root, 42, marker)
    out = cli.fails("verify", root)
    check("array 'values/f32_arange' box [5:7, 0:5] chunk 0 (rows 5..7): checksum mismatch" in out,
          "a forged chunk checksum in a format-2 marker is named")


def case_gc(cli, fixture, fixture_v2, work):
    root = fresh_copy(fixture, work, "gc")
    add_uncommitted(root)
    # A step a job retired (marker gone, directory renamed) but did not finish removing.
    retired = os.path.join(root, ".retired.step_0000000007.1.0")
    os.makedirs(retired)
    with open(os.path.join(retired, "data.h5"), "wb") as f:
        f.write(b"old bytes")
    exists = lambda step: os.path.isdir(step_dir(root, step))
    out = cli.ok("gc", root, "--keep", 1, "--dry-run")
    check(all(exists(s) for s in (10, 41, 42, 99)), "a dry run deletes nothing")
    check(os.path.isdir(retired), "a dry run leaves the retired directory")
    check("would delete step 10" in out and "would delete step 41" in out, "dry run says what")
    check("would delete " + retired in out, "dry run names the retired directory")
    # While a job owns the root (here: this process holds its lock), gc deletes nothing.
    with open(os.path.join(root, "mhckpt.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = cli.fails("gc", root, "--keep", 1)
        check("gc deleted nothing" in out and "in use by another job" in out, "gc names the owner")
        check(all(exists(s) for s in (10, 41, 42, 99)), "gc deleted nothing while the root is owned")
        cli.ok("gc", root, "--keep", 1, "--dry-run")  # a dry run only reads
    out = cli.ok("gc", root, "--keep", 1)
    check(not exists(10) and not exists(41), "old committed and uncommitted steps deleted")
    check(not os.path.exists(retired) and "deleted " + retired in out, "retired directory deleted")
    check(exists(42) and os.path.exists(os.path.join(step_dir(root, 42), "commit.json")), "newest kept")
    check(exists(99) and "kept step 99" in out, "a newer uncommitted step may be a save in progress")
    cli.ok("verify", root)
    cli.ok("gc", root, "--keep", 1, "--force")
    check(not exists(99) and exists(42), "--force deletes it")
    cli.fails("gc", root, "--keep", 0)
    check(exists(42), "--keep 0 is refused")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["list", "list_local", "inspect", "verify_damage", "gc"])
    parser.add_argument("--mhckpt", required=True)
    parser.add_argument("--fixture", required=True)
    parser.add_argument("--fixture-v2", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--mpiexec", default="")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    cli = Cli(args.mhckpt, args.mpiexec)
    globals()["case_" + args.case](cli, args.fixture, args.fixture_v2, args.work)
    print("cli_test %s: passed" % args.case)


if __name__ == "__main__":
    main()
