"""What the kill and model tests report of a hung job: the ranks under
mpirun (children_of) and their threads' backtraces (backtraces, with gdb)."""
import os
import shutil
import subprocess


def children_of(pid):
    """Every live descendant of `pid` (mpirun's ranks), from /proc."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    stat = f.read()
                parent[int(name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def backtraces(pids):
    """All-thread backtraces of `pids` (gdb), for the report of a hang."""
    if not shutil.which("gdb"):
        return "(no gdb for backtraces)"
    text = []
    for pid in pids:
        try:
            p = subprocess.run(
                ["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                capture_output=True, text=True, timeout=60)
            text.append("--- pid %d ---\n%s" % (pid, "\n".join(
                l for l in p.stdout.splitlines() if l.startswith(("#", "Thread")))))
        except (OSError, subprocess.SubprocessError) as e:
            text.append("--- pid %d: gdb failed: %s" % (pid, e))
    return "\n".join(text)
