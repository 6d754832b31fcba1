"""Session fixtures of the mhckpt pytest suite.

Run under MPI: ``mpirun -np N python -m pytest python/tests`` (or
python/run_pytest.sh N, which ctest calls at N = 1, 2, 3, 4). Every rank runs
the same tests in the same order; mpi4py initialises MPI (with
MPI_THREAD_MULTIPLE, so saves commit in the background).

jax.distributed (CPU collectives over gloo) and torch.distributed (gloo) are
initialised once, by the first test that asks for the ``jax_dist`` or
``torch_dist`` fixture, and only then: a run that selects no jax or torch
test never imports them.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
from mpi4py import MPI

import mhckpt
from support import free_port  # noqa: E402  (tests/)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("mhckpt")
    group.addoption("--reshard-mode", choices=("save", "restore"),
                    help="test_reshard.py: save a checkpoint, or restore one saved at another size")
    group.addoption("--reshard-dir", help="test_reshard.py: the checkpoint root")
    group.addoption("--reshard-from", default="",
                    help="test_reshard.py --reshard-mode restore: the world sizes of the saves, "
                         "comma-separated (each saved into RESHARD_DIR/fromN)")


class _RankFailures:
    """The report of a rank other than 0: one line per failure, prefixed by
    the rank (rank 0 prints pytest's full report; four interleaved copies of
    it would be unreadable)."""

    def __init__(self, rank: int):
        self.rank = rank

    def _report(self, report) -> None:
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            lines = str(report.longrepr).strip().splitlines()
            why = crash.message if crash is not None else (lines[-1] if lines else "")
            sys.stderr.write(f"[rank {self.rank}] FAILED {report.nodeid} ({report.when}): {why}\n")

    def pytest_runtest_logreport(self, report) -> None:
        self._report(report)

    def pytest_collectreport(self, report) -> None:
        self._report(report)


@pytest.hookimpl(trylast=True)
def pytest_configure(config) -> None:
    rank = MPI.COMM_WORLD.Get_rank()
    if rank != 0:
        # pytest's reporter stays (other plugins write through it), into /dev/null.
        terminal = config.pluginmanager.getplugin("terminalreporter")
        if terminal is not None:
            config.pluginmanager.unregister(terminal)
            sink = open(os.devnull, "w")
            config.add_cleanup(sink.close)
            config.pluginmanager.register(pytest.TerminalReporter(config, sink), "terminalreporter")
        config.pluginmanager.register(_RankFailures(rank), "mhckpt_rank_failures")


@pytest.fixture(scope="session")
def comm():
    """The world communicator (mpi4py)."""
    return MPI.COMM_WORLD


@pytest.fixture(autouse=True)
def _no_preemption_notice():
    """A preemption notice is the process's (mhckpt.notify_preemption, or a
    signal of a manager's preemption_signals): forgotten after each test, so
    that it reaches no manager of the next one."""
    yield
    mhckpt.clear_preemption_notice()


@pytest.fixture(scope="session")
def shared_dir(comm) -> Iterator[str]:
    """A directory that every rank sees: made by rank 0 under $MHCKPT_TEST_DIR
    (ctest's testdata/) or the system temp dir, broadcast, removed at the end."""
    path = None
    if comm.rank == 0:
        base = os.environ.get("MHCKPT_TEST_DIR") or None
        if base:
            os.makedirs(base, exist_ok=True)
        path = tempfile.mkdtemp(prefix=f"pytest_np{comm.size}_", dir=base)
    path = comm.bcast(path, root=0)
    yield path
    comm.Barrier()  # nobody still reads it
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root(request, shared_dir, comm) -> str:
    """A fresh checkpoint root for one test (the same path on every rank)."""
    path = os.path.join(shared_dir, request.node.name.replace("/", "_"))
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    comm.Barrier()
    return path


@pytest.fixture
def mgr(root) -> Iterator[mhckpt.CheckpointManager]:
    """A CheckpointManager on a fresh root, closed after the test."""
    m = mhckpt.CheckpointManager(root, collective_timeout_seconds=120)
    yield m
    m.close()


@dataclass
class JaxDist:
    """jax after ``jax.distributed.initialize``: one CPU device per process."""

    jax: Any
    rank: int
    size: int

    def mesh(self, shape=None, names=("x",)):
        """A Mesh over every process's device (1-d by default)."""
        import numpy as np

        devices = np.array(self.jax.devices())
        if shape is not None:
            devices = devices.reshape(shape)
        return self.jax.sharding.Mesh(devices, names)

    def sharding(self, spec, mesh=None):
        """NamedSharding of a PartitionSpec tuple, e.g. ("x", None)."""
        P = self.jax.sharding.PartitionSpec
        return self.jax.sharding.NamedSharding(mesh or self.mesh(), P(*spec))

    def array(self, global_np, sharding):
        """A global jax.Array with ``sharding``, each process building its own
        shards from the global numpy data (no device_put across processes)."""
        return self.jax.make_array_from_callback(
            global_np.shape, sharding, lambda index: global_np[index]
        )


@pytest.fixture(scope="session")
def jax_dist(comm) -> Iterator[JaxDist]:
    """jax with one CPU device per rank, CPU collectives over gloo."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax = pytest.importorskip("jax")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    port = free_port(comm)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=comm.size, process_id=comm.rank)
    assert jax.process_count() == comm.size and len(jax.devices()) == comm.size
    yield JaxDist(jax, comm.rank, comm.size)
    comm.Barrier()
    jax.distributed.shutdown()


@dataclass
class TorchDist:
    """torch after ``init_process_group("gloo")`` and a 1-d CPU DeviceMesh."""

    torch: Any
    mesh: Any
    rank: int
    size: int

    def dtensor(self, global_np, placement):
        """A DTensor of the global numpy data with one ``placement`` on the
        1-d mesh, each rank building its own local tensor (torch.chunk's
        split, see support.dtensor_slice): no communication, any dtype
        (gloo's scatter, which distribute_tensor uses, refuses int16)."""
        from torch.distributed.tensor import DTensor

        from support import dtensor_slice, torch_tensor

        local = torch_tensor(dtensor_slice(self, global_np, placement))
        shape = self.torch.Size(global_np.shape)
        stride = self.torch.empty(shape, device="meta").stride()  # row-major
        return DTensor.from_local(local, self.mesh, [placement], run_check=False,
                                  shape=shape, stride=stride)


@pytest.fixture(scope="session")
def torch_dist(comm) -> Iterator[TorchDist]:
    """torch.distributed over gloo, with a CPU DeviceMesh of every rank."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    port = free_port(comm)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size
    )
    mesh = init_device_mesh("cpu", (comm.size,))
    yield TorchDist(torch, mesh, comm.rank, comm.size)
    comm.Barrier()
    dist.destroy_process_group()
