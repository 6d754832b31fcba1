"""The file-system model of the crash-state explorer (explore.py): a recorded
trace (record_fs.c) becomes a list of operations, and a crash state is the
result of applying, in order, the operations a power loss may have kept.

The persistence model (docs/TESTING.md "Crash states"):

* Operations are ordered by the time they returned (CLOCK_MONOTONIC, one clock
  for every rank on one machine). A crash cuts that order after some
  operation: nothing later happened.
* fsync/fdatasync of a file makes durable every write, truncate and size change
  of that file that returned before the fsync began — from any process (the
  page cache is per file, not per descriptor). fsync of a directory makes
  durable every name operation (create, mkdir, unlink, rmdir, rename,
  exchange: renameat2's RENAME_EXCHANGE) in that
  directory that returned before it began. sync/syncfs make everything before
  them durable. sync_file_range makes nothing durable. Nothing else does: not
  close, not O_DIRECT (the device cache and the extent metadata are not
  flushed), not an fsync of the file for its own name.
* A shared writable mapping's stores are logged by the shim as one write of
  the whole mapping (op=mmap_write) when they could next reach the disk's
  durable state: before an fsync of the file, at msync, at munmap, at exit.
  A crash before that write shows the file without them.
* Everything not made durable may be lost. Data is lost at page granularity
  (4 KiB pieces of a write; --granularity write keeps writes whole).
* Two models of what survives among the non-durable operations:
    ext4   metadata (names and sizes) is journaled in order: what survives is
           a prefix of the metadata operations, at least up to the last one
           made durable; data pieces survive or not independently of each
           other and of the metadata (data=ordered gives more than this; this
           model does not rely on it).
    posix  every non-durable operation survives or not independently; one
           that cannot apply in the resulting state (its directory or source
           missing) does not.
  Both keep rename atomic: the old name or the new one, never neither; and
  an exchange: both names swapped, or neither.

Parsing checks the trace: an operation this model cannot express (reported
by the shim as op=unsupported, a punch-hole fallocate, an open of a path that
is not there) stops the exploration rather than building wrong states.
"""
import hashlib
import os
import re

PAGE = 4096
NAME_OPS = ("create", "mkdir", "unlink", "rmdir", "rename", "exchange")
SIZE_OPS = ("setsize", "extend")
META_OPS = NAME_OPS + SIZE_OPS
O_CREAT, O_TRUNC, O_TMPFILE_BITS = 0o100, 0o1000, 0o20000000
FALLOC_FL_KEEP_SIZE = 1
RENAME_EXCHANGE = 2


class TraceError(Exception):
    """The trace holds something the model cannot express."""


class Op:
    """One operation of the model. kind: create mkdir unlink rmdir rename
    exchange setsize extend write fsync sync. `parents` are the directory
    nodes a name operation changes; `node` the file or directory it acts on
    (an exchange: `node` at `path` and `node2` at `path2`)."""

    __slots__ = ("idx", "t0", "t1", "pid", "kind", "node", "node2", "path", "path2", "off",
                 "data", "size", "parents", "wid")

    def __init__(self, kind, t0, t1, pid, **kw):
        self.kind, self.t0, self.t1, self.pid = kind, t0, t1, pid
        self.idx = -1
        self.node, self.node2 = kw.get("node"), kw.get("node2")
        self.path, self.path2 = kw.get("path"), kw.get("path2")
        self.off, self.data, self.size = kw.get("off", 0), kw.get("data"), kw.get("size", 0)
        self.parents = kw.get("parents", ())
        self.wid = kw.get("wid", -1)

    def describe(self):
        if self.kind == "write":
            return "write %s [%d, %d) (pid %d)" % (self.path, self.off, self.off + len(self.data),
                                                   self.pid)
        if self.kind in ("setsize", "extend"):
            return "%s %s to %d" % (self.kind, self.path, self.size)
        if self.kind == "rename":
            return "rename %s -> %s" % (self.path, self.path2)
        if self.kind == "exchange":
            return "exchange %s <-> %s" % (self.path, self.path2)
        return "%s %s (pid %d)" % (self.kind, self.path or "", self.pid)


# ---- reading the shim's logs ----

_FIELD = re.compile(r"(\w+)=(\S*)")


def _unescape(s):
    return re.sub(r"%([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), s)


def read_logs(rec_dir):
    """Every logged call of every process, sorted by return time, with the
    bytes of each write."""
    events = []
    for name in sorted(os.listdir(rec_dir)):
        m = re.fullmatch(r"ops\.(\d+)\.log", name)
        if not m:
            continue
        with open(os.path.join(rec_dir, "data.%s.bin" % m.group(1)), "rb") as f:
            blob = f.read()
        with open(os.path.join(rec_dir, name)) as f:
            for line in f:
                e = dict(_FIELD.findall(line))
                for k in ("t0", "t1", "pid", "ret", "fd", "ino", "dev", "dir", "oflags", "flags",
                          "off", "len", "blob"):
                    e[k] = int(e[k])
                e["path"], e["path2"] = _unescape(e["path"]), _unescape(e["path2"])
                if e["blob"] >= 0:
                    e["data"] = blob[e["blob"]:e["blob"] + e["ret"]]
                events.append(e)
    events.sort(key=lambda e: (e["t1"], e["t0"]))
    return events


# ---- the namespace of a root: relative path -> node ----

class Base:
    """The root as it was before the recorded save (a durable snapshot)."""

    def __init__(self, snapshot_dir):
        self.kinds = {0: "dir"}  # node -> "dir" | "file"
        self.ns = {"": 0}  # relative path -> node
        self.content = {}  # node -> bytes (files)
        for dirpath, dirnames, filenames in os.walk(snapshot_dir):
            rel = os.path.relpath(dirpath, snapshot_dir)
            rel = "" if rel == "." else rel
            for d in sorted(dirnames):
                self._add(os.path.join(rel, d), "dir")
            for fn in sorted(filenames):
                node = self._add(os.path.join(rel, fn), "file")
                with open(os.path.join(dirpath, fn), "rb") as f:
                    self.content[node] = f.read()
        self.digest = {n: hashlib.sha1(c).hexdigest() for n, c in self.content.items()}

    def _add(self, rel, kind):
        node = len(self.kinds)
        self.kinds[node] = kind
        self.ns[rel] = node
        return node


def _rename_in(ns, src, dst):
    """Moves `src` (and, for a directory, everything below it) to `dst`."""
    moved = {p: n for p, n in ns.items() if p == src or p.startswith(src + "/")}
    for p in moved:
        del ns[p]
    for p in [p for p in ns if p == dst or p.startswith(dst + "/")]:
        del ns[p]
    for p, n in moved.items():
        ns[dst + p[len(src):]] = n


def _exchange_in(ns, a, b):
    """Swaps the names `a` and `b` (and, for directories, what is below them)."""
    below_a = {p: n for p, n in ns.items() if p == a or p.startswith(a + "/")}
    below_b = {p: n for p, n in ns.items() if p == b or p.startswith(b + "/")}
    for p in list(below_a) + list(below_b):
        del ns[p]
    for p, n in below_a.items():
        ns[b + p[len(a):]] = n
    for p, n in below_b.items():
        ns[a + p[len(b):]] = n


def _parent(rel):
    return os.path.dirname(rel)


class Parser:
    """Turns logged calls into model operations, following the namespace as
    the calls changed it (so that inode numbers reused after an unlink, and
    several processes opening one file, map to the right node)."""

    def __init__(self, base, root):
        self.root = root.rstrip("/")
        self.kinds = dict(base.kinds)
        self.ns = dict(base.ns)
        self.by_ino = {}  # (dev, ino) -> node, as last opened
        self.ops = []
        self.ignored = {}  # op name -> count of calls with no effect in the model

    def rel(self, path):
        if path == self.root:
            return ""
        if not path.startswith(self.root + "/"):
            raise TraceError("path outside the root: %s" % path)
        return path[len(self.root) + 1:]

    def new_node(self, kind):
        node = len(self.kinds) + 1000000  # apart from the base's numbers
        while node in self.kinds:
            node += 1
        self.kinds[node] = kind
        return node

    def emit(self, kind, e, **kw):
        self.ops.append(Op(kind, e["t0"], e["t1"], e["pid"], **kw))

    def fd_node(self, e):
        key = (e["dev"], e["ino"])
        if key not in self.by_ino:
            raise TraceError("%s on a descriptor never opened: %s" % (e["op"], e))
        return self.by_ino[key]

    def node_path(self, node):
        for p, n in self.ns.items():
            if n == node:
                return p
        return "(unlinked node %d)" % node

    def on_open(self, e):
        rel, flags = self.rel(e["path"]), e["oflags"]
        if flags & O_TMPFILE_BITS == O_TMPFILE_BITS:
            raise TraceError("O_TMPFILE is not modelled: %s" % e["path"])
        if rel in self.ns:
            node = self.ns[rel]
            if flags & O_TRUNC and self.kinds[node] == "file":
                self.emit("setsize", e, node=node, path=rel, size=0)
        elif flags & O_CREAT:
            node = self.new_node("file")
            self.emit("create", e, node=node, path=rel, parents=(self.ns[_parent(rel)],))
            self.ns[rel] = node
        else:
            raise TraceError("open of a path the trace never created: %s" % e["path"])
        self.by_ino[(e["dev"], e["ino"])] = node

    def on_names(self, e):
        op, rel = e["op"], self.rel(e["path"])
        if op == "mkdir":
            node = self.new_node("dir")
            self.emit("mkdir", e, node=node, path=rel, parents=(self.ns[_parent(rel)],))
            self.ns[rel] = node
        elif op in ("unlink", "rmdir"):
            self.emit(op, e, node=self.ns[rel], path=rel, parents=(self.ns[_parent(rel)],))
            del self.ns[rel]
        elif e["flags"] & RENAME_EXCHANGE:
            dst = self.rel(e["path2"])
            parents = (self.ns[_parent(rel)], self.ns[_parent(dst)])
            self.emit("exchange", e, node=self.ns[rel], node2=self.ns[dst], path=rel, path2=dst,
                      parents=parents)
            _exchange_in(self.ns, rel, dst)
        else:  # rename
            dst = self.rel(e["path2"])
            parents = (self.ns[_parent(rel)], self.ns[_parent(dst)])
            self.emit("rename", e, node=self.ns[rel], path=rel, path2=dst, parents=parents)
            _rename_in(self.ns, rel, dst)

    def on_data(self, e):
        op = e["op"]
        node = self.fd_node(e) if op != "truncate_path" else self.ns[self.rel(e["path"])]
        path = self.node_path(node)
        if op in ("write", "mmap_write"):
            if e["off"] < 0:
                raise TraceError("a write at an unknown offset: %s" % e)
            self.emit("write", e, node=node, path=path, off=e["off"], data=e["data"])
        elif op in ("truncate", "truncate_path"):
            self.emit("setsize", e, node=node, path=path, size=e["len"])
        elif op == "fallocate":
            if e["flags"] & ~FALLOC_FL_KEEP_SIZE:
                raise TraceError("fallocate mode %d is not modelled" % e["flags"])
            if not e["flags"] & FALLOC_FL_KEEP_SIZE:
                self.emit("extend", e, node=node, path=path, size=e["off"] + e["len"])
        else:  # fsync, fdatasync
            self.emit("fsync", e, node=node, path=path)

    def feed(self, e):
        op = e["op"]
        if op == "unsupported":
            raise TraceError("the save did something the model cannot express: %s %s"
                             % (e["path2"], e["path"]))
        if e["ret"] < 0:
            self.ignored["failed " + op] = self.ignored.get("failed " + op, 0) + 1
        elif op == "open":
            self.on_open(e)
        elif op in ("mkdir", "unlink", "rmdir", "rename"):
            self.on_names(e)
        elif op in ("write", "mmap_write", "truncate", "truncate_path", "fallocate", "fsync",
                    "fdatasync"):
            self.on_data(e)
        elif op == "sync":
            self.emit("sync", e)
        else:  # close, sync_file_range: no effect on what is durable
            self.ignored[op] = self.ignored.get(op, 0) + 1


def parse(events, base, root, granularity="page"):
    """The model operations of a trace, numbered in return order; writes are
    cut into page pieces (granularity "page") that share the write's `wid`."""
    p = Parser(base, root)
    for e in events:
        p.feed(e)
    ops = []
    for wid, op in enumerate(p.ops):
        op.wid = wid
        if op.kind == "write" and granularity == "page":
            ops += _pieces(op)
        else:
            ops.append(op)
    for i, op in enumerate(ops):
        op.idx = i
    return ops, p.kinds, p.ignored


def _pieces(op):
    out, pos, end = [], op.off, op.off + len(op.data)
    while pos < end:
        stop = min(end, (pos // PAGE + 1) * PAGE)
        piece = Op("write", op.t0, op.t1, op.pid, node=op.node, path=op.path, off=pos,
                   data=op.data[pos - op.off:stop - op.off], wid=op.wid)
        out.append(piece)
        pos = stop
    return out or [op]


# ---- durability ----

def forced_at(ops, barriers=None):
    """For each operation, the index of the first barrier that makes it
    durable (len(ops) if none): a crash cut after that barrier keeps it.
    `barriers` (default: every fsync and sync) lets a control drop some."""
    n = len(ops)
    if barriers is None:
        barriers = [op for op in ops if op.kind in ("fsync", "sync")]
    at = [n] * n
    for b in barriers:
        for op in ops:
            if op.t1 >= b.t0 or at[op.idx] <= b.idx or op.kind in ("fsync", "sync"):
                continue
            if b.kind == "sync":
                hit = True
            elif op.kind in NAME_OPS:
                hit = b.node in op.parents
            else:
                hit = op.node == b.node
            if hit:
                at[op.idx] = b.idx
    return at


# ---- building a state ----

class State:
    """A namespace (relative path -> node) and the contents of the files the
    kept operations changed."""

    def __init__(self, base, kinds):
        self.base, self.kinds = base, kinds
        self.ns = dict(base.ns)
        self.content = {}  # node -> bytearray, for nodes changed

    def data(self, node):
        if node not in self.content:
            self.content[node] = bytearray(self.base.content.get(node, b""))
        return self.content[node]

    def apply(self, op):
        k, ns = op.kind, self.ns
        if k == "write":
            d = self.content.get(op.node)
            if d is None:
                d = self.data(op.node)
            end = op.off + len(op.data)
            if len(d) < op.off:
                d.extend(bytes(op.off - len(d)))
            d[op.off:end] = op.data
        elif k in ("create", "mkdir"):
            if _parent(op.path) in ns and self.kinds[ns[_parent(op.path)]] == "dir" and \
                    op.path not in ns:
                ns[op.path] = op.node
                if k == "create":
                    self.content[op.node] = bytearray()
        elif k == "unlink":
            if ns.get(op.path) == op.node:
                del ns[op.path]
        elif k == "rmdir":
            if ns.get(op.path) == op.node and not any(p.startswith(op.path + "/") for p in ns):
                del ns[op.path]
        elif k == "rename":
            if ns.get(op.path) == op.node and _parent(op.path2) in ns:
                _rename_in(ns, op.path, op.path2)
        elif k == "exchange":
            if ns.get(op.path) == op.node and ns.get(op.path2) == op.node2:
                _exchange_in(ns, op.path, op.path2)
        elif k == "setsize":
            d = self.data(op.node)
            del d[op.size:]
            d.extend(bytes(max(0, op.size - len(d))))
        elif k == "extend":
            d = self.data(op.node)
            d.extend(bytes(max(0, op.size - len(d))))

    def file_bytes(self, rel):
        """The bytes of file `rel` (bytes or bytearray, not to be changed), or
        None if there is no such file."""
        node = self.ns.get(rel)
        if node is None or self.kinds[node] != "file":
            return None
        return self.content[node] if node in self.content else self.base.content[node]

    def key(self):
        """A digest of the state: every name, its kind and its bytes."""
        h = hashlib.sha1()
        for rel in sorted(self.ns):
            node = self.ns[rel]
            kind = self.kinds[node]
            if kind == "file":
                c = self.content.get(node)
                dig = hashlib.sha1(c).hexdigest() if c is not None else self.base.digest[node]
            else:
                dig = "-"
            h.update(("%s\0%s\0%s\n" % (rel, kind, dig)).encode())
        return h.hexdigest()

    def materialise(self, dest):
        os.makedirs(dest)
        for rel in sorted(self.ns, key=lambda p: (p.count("/"), p)):
            if not rel:
                continue
            path = os.path.join(dest, rel)
            if self.kinds[self.ns[rel]] == "dir":
                os.mkdir(path)
            else:
                with open(path, "wb") as f:
                    f.write(self.file_bytes(rel))


def build(base, kinds, ops, cut, kept=None):
    """The state after a crash right after ops[cut-1]: the operations before
    the cut whose index is in `kept` (default: all of them), applied in order."""
    s = State(base, kinds)
    apply = s.apply
    for op in ops[:cut]:
        if kept is None or op.idx in kept:
            apply(op)
    return s


def tree_key(base_dir):
    """State.key() of a directory on disk (to compare the model with reality)."""
    b = Base(base_dir)
    return State(b, b.kinds).key()
