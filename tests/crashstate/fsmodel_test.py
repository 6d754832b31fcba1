#!/usr/bin/python3
"""Unit tests of the crash-state model (fsmodel.py) and of the explorer's
state generation (explore.py) on small made-up traces: no MPI, no shim.

    fsmodel_test.py        (ctest: crashstate.model)
"""
import os
import random
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import explore  # noqa: E402
import fsmodel  # noqa: E402

ROOT = "/r"
O_RDWR, O_CREAT, O_TRUNC, O_DIRECTORY = 0o2, 0o100, 0o1000, 0o200000


class Trace:
    """Builds logged calls as record_fs.c writes them, one per tick."""

    def __init__(self):
        self.events, self.t, self.ino = [], 0, 100

    def call(self, op, pid=1, **kw):
        self.t += 10
        e = {"t0": self.t, "t1": self.t + 5, "pid": pid, "op": op, "ret": 0, "fd": 3, "ino": 0,
             "dev": 1, "dir": 0, "oflags": 0, "flags": 0, "off": 0, "len": 0, "blob": -1,
             "path": "", "path2": ""}
        e.update(kw)
        self.events.append(e)
        return e

    def open(self, rel, flags=O_RDWR | O_CREAT, ino=None, pid=1):
        if ino is None:
            self.ino += 1
            ino = self.ino
        self.call("open", pid=pid, path=os.path.join(ROOT, rel).rstrip("/"), oflags=flags, ino=ino)
        return ino

    def write(self, ino, off, data, pid=1):
        self.call("write", pid=pid, ino=ino, off=off, ret=len(data), data=data)

    def fsync(self, ino, pid=1):
        self.call("fsync", pid=pid, ino=ino)

    def name(self, op, rel, rel2=""):
        self.call(op, fd=-1, path=os.path.join(ROOT, rel),
                  path2=os.path.join(ROOT, rel2) if rel2 else "")


class ModelTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fsmodel_test.")
        os.makedirs(os.path.join(self.dir, "old"))
        with open(os.path.join(self.dir, "old", "f"), "wb") as f:
            f.write(b"old!")
        self.base = fsmodel.Base(self.dir)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def states(self, trace, model, granularity="page"):
        """Every distinct state (as {rel: bytes or 'dir'}) the explorer makes."""
        ops, kinds, _ = fsmodel.parse(trace.events, self.base, ROOT, granularity)
        ex = explore.Explorer(self.base, kinds, ops, model, random.Random(0))
        out = {}
        for key, s, _ in ex.states(per_cut=30, write_cuts=-1):
            out[key] = {rel: (bytes(s.file_bytes(rel)) if s.kinds[n] == "file" else "dir")
                        for rel, n in s.ns.items() if rel}
        return list(out.values())

    def commit_trace(self, fsync_dir_before_rename):
        """data written and fsynced, a marker written atomically."""
        t = Trace()
        t.name("mkdir", "s")
        t.fsync(t.open("", O_DIRECTORY, ino=1))
        d = t.open("s/data")
        t.write(d, 0, b"D" * 10)
        t.fsync(d)
        sdir = t.open("s", O_DIRECTORY, ino=2)
        if fsync_dir_before_rename:
            t.fsync(sdir)
        m = t.open("s/m.tmp", O_RDWR | O_CREAT | O_TRUNC)
        t.write(m, 0, b"M")
        t.fsync(m)
        t.name("rename", "s/m.tmp", "s/m")
        t.fsync(sdir)
        return t

    def test_unsynced_write_may_be_lost_synced_never(self):
        t = Trace()
        ino = t.open("old/f", O_RDWR)
        t.write(ino, 0, b"new!")
        seen = {s["old/f"] for s in self.states(t, "posix")}
        self.assertEqual(seen, {b"old!", b"new!"})
        t.fsync(ino)
        t.write(ino, 0, b"NEW!")
        ops, kinds, _ = fsmodel.parse(t.events, self.base, ROOT)
        ex = explore.Explorer(self.base, kinds, ops, "posix", random.Random(0))
        last = len(ops)
        forced, _, free = ex.window(last)
        self.assertEqual([op.data for op in free], [b"NEW!"])
        first = next(op for op in ops if op.kind == "write")
        self.assertIn(first.idx, forced)  # fsynced

    def test_fsync_by_another_process_covers_the_file(self):
        t = Trace()
        a = t.open("old/f", O_RDWR, pid=1)
        t.open("old/f", O_RDWR, ino=a, pid=2)
        t.write(a, 0, b"two!", pid=2)
        t.fsync(a, pid=1)
        ops, kinds, _ = fsmodel.parse(t.events, self.base, ROOT)
        at = fsmodel.forced_at(ops)
        write = next(op for op in ops if op.kind == "write")
        self.assertEqual(ops[at[write.idx]].kind, "fsync")

    def test_write_concurrent_with_fsync_is_not_covered(self):
        t = Trace()
        a = t.open("old/f", O_RDWR)
        t.write(a, 0, b"late")
        t.events[-1]["t1"] = t.t + 20  # returns after the fsync below began
        t.fsync(a)
        ops, kinds, _ = fsmodel.parse(t.events, self.base, ROOT)
        write = next(op for op in ops if op.kind == "write")
        self.assertEqual(fsmodel.forced_at(ops)[write.idx], len(ops))

    def test_pages_of_one_write_are_lost_independently(self):
        t = Trace()
        ino = t.open("new")
        t.write(ino, 0, b"a" * 4096 + b"b" * 4096)
        t.fsync(t.open("", O_DIRECTORY, ino=1))
        contents = {s.get("new") for s in self.states(t, "ext4")}
        self.assertIn(b"a" * 4096 + b"b" * 4096, contents)
        self.assertIn(bytes(4096) + b"b" * 4096, contents)  # the first page lost, not the second
        whole = {s.get("new") for s in self.states(t, "ext4", granularity="write")}
        self.assertNotIn(bytes(4096) + b"b" * 4096, whole)

    def test_inode_numbers_reused_after_unlink_map_to_new_files(self):
        t = Trace()
        a = t.open("tmp1")
        t.name("unlink", "tmp1")
        t.open("data", ino=a)  # the same inode number, a new file
        t.write(a, 0, b"x")
        ops, kinds, _ = fsmodel.parse(t.events, self.base, ROOT)
        s = fsmodel.build(self.base, kinds, ops, len(ops))
        self.assertEqual(s.file_bytes("data"), b"x")
        self.assertIsNone(s.file_bytes("tmp1"))

    def test_rename_is_atomic_and_needs_the_directory_fsync(self):
        t = Trace()
        m = t.open("m.tmp")
        t.write(m, 0, b"M")
        t.fsync(m)
        t.name("rename", "m.tmp", "m")
        for model in ("ext4", "posix"):
            names = [frozenset(s) - {"old", "old/f"} for s in self.states(t, model)]
            self.assertIn(frozenset({"m.tmp"}), names)
            self.assertIn(frozenset({"m"}), names)
            self.assertNotIn(frozenset({"m", "m.tmp"}), names)
        t.fsync(t.open("", O_DIRECTORY, ino=1))
        ops, kinds, _ = fsmodel.parse(t.events, self.base, ROOT)
        ex = explore.Explorer(self.base, kinds, ops, "posix", random.Random(0))
        _, free_meta, _ = ex.window(len(ops))
        self.assertEqual(free_meta, [])

    def test_exchange_swaps_both_names_or_neither(self):
        """renameat2(RENAME_EXCHANGE), logged as a rename with its flag: the
        two files swap names atomically, durable with the directory fsync."""
        t = Trace()
        a = t.open("a")
        t.write(a, 0, b"A")
        t.fsync(a)
        b = t.open("b")
        t.write(b, 0, b"B")
        t.fsync(b)
        t.fsync(t.open("", O_DIRECTORY, ino=1))
        t.call("rename", fd=-1, path=os.path.join(ROOT, "a"), path2=os.path.join(ROOT, "b"),
               flags=fsmodel.RENAME_EXCHANGE)
        for model in ("ext4", "posix"):
            # Cuts before the files were durable lose them; any cut keeps
            # the two names apart (never one file under both, nor a file
            # under neither once both were there).
            seen = {(s.get("a"), s.get("b")) for s in self.states(t, model)}
            self.assertIn((b"A", b"B"), seen, model)
            self.assertIn((b"B", b"A"), seen, model)
            self.assertFalse({(b"A", b"A"), (b"B", b"B"), (None, b"A"), (b"B", None)} & seen,
                             model)
        t.fsync(t.open("", O_DIRECTORY, ino=1))
        ops, kinds, _ = fsmodel.parse(t.events, self.base, ROOT)
        self.assertEqual([op.kind for op in ops if op.kind in fsmodel.NAME_OPS][-1], "exchange")
        ex = explore.Explorer(self.base, kinds, ops, "posix", random.Random(0))
        _, free_meta, _ = ex.window(len(ops))
        self.assertEqual(free_meta, [])

    def test_ext4_keeps_metadata_in_order_posix_does_not(self):
        """The marker durable while the data file's name is not: possible
        without a directory fsync between them, under posix only."""
        def marker_without_data(t, model):
            return any("s/m" in s and "s/data" not in s for s in self.states(t, model))
        t = self.commit_trace(fsync_dir_before_rename=False)
        self.assertFalse(marker_without_data(t, "ext4"))
        self.assertTrue(marker_without_data(t, "posix"))
        t = self.commit_trace(fsync_dir_before_rename=True)
        self.assertFalse(marker_without_data(t, "posix"))

    def test_marker_never_without_whole_data_when_fsynced_first(self):
        t = self.commit_trace(fsync_dir_before_rename=True)
        for model in ("ext4", "posix"):
            for s in self.states(t, model):
                if "s/m" in s:
                    self.assertEqual(s.get("s/data"), b"D" * 10)

    def test_a_mapping_write_is_a_write_of_its_file(self):
        """A shared mapping's bytes (op=mmap_write, logged by dev and ino, no
        fd) count as a write of the file: lost without an fsync of it,
        durable after one."""
        t = Trace()
        ino = t.open("mapped")
        t.call("truncate", ino=ino, len=4096)
        t.call("mmap_write", fd=-1, ino=ino, off=0, ret=4096, data=b"m" * 4096)
        t.fsync(t.open("", O_DIRECTORY, ino=1))
        contents = {s.get("mapped") for s in self.states(t, "ext4")}
        self.assertEqual(contents, {None, b"", bytes(4096), b"m" * 4096})
        t.fsync(ino)
        ops, kinds, _ = fsmodel.parse(t.events, self.base, ROOT)
        write = next(op for op in ops if op.kind == "write")
        self.assertEqual(write.path, "mapped")
        self.assertLess(fsmodel.forced_at(ops)[write.idx], len(ops))

    def test_unsupported_calls_stop_the_exploration(self):
        t = Trace()
        t.call("unsupported", path=ROOT + "/x", path2="link")
        with self.assertRaises(fsmodel.TraceError):
            fsmodel.parse(t.events, self.base, ROOT)
        t = Trace()
        t.open("never", O_RDWR)  # opened without O_CREAT, never created
        with self.assertRaises(fsmodel.TraceError):
            fsmodel.parse(t.events, self.base, ROOT)


if __name__ == "__main__":
    unittest.main()
