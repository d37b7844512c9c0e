"""The fault matrix, in CI: every pool fault (a rank raises, exits, is SIGKILLed, segfaults, hangs inside
a collective or outside one) at 2 and 4 ranks is labelled with the rank (and, for a hang, every stuck
rank's stack), leaves the pool reusable, leaves no process of the faulted world alive, and no
temporary folder behind once the pool is closed. One pool per world size serves the whole matrix.
"""

from __future__ import annotations

import ctypes
import os
import signal
import tempfile
import time

import pytest

from distcheck.core.errors import RankFailure, WorldTimeout

#: seconds a hanging step is given: short, so the matrix stays well under a minute
HANG_TIMEOUT_S = 1.0


def _barrier_unless_1(ctx, fault):
    import torch.distributed as dist

    if ctx.rank == 1:
        if fault == "raise":
            raise ValueError("planted fault on rank 1")
        if fault == "exit":
            os._exit(7)
        if fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "segfault":
            ctypes.string_at(0)
        if fault == "hang-outside":
            while True:  # plain Python, in no collective
                time.sleep(0.05)
        if fault == "hang-inside":
            dist.barrier()  # a collective no other rank joins
            dist.barrier()
            return ctx.rank
    if fault == "hang-inside":
        dist.barrier()  # the others join the first barrier only: rank 1 waits in the second for ever
        return ctx.rank
    dist.barrier()  # the others wait in a collective for rank 1
    return ctx.rank


def _sum_of_ranks(ctx):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t, group=ctx.group)
    return t.item()


#: fault -> (error type, text its report must hold)
FAULTS = {
    "raise": (RankFailure, "ValueError: planted fault on rank 1"),
    "exit": (RankFailure, "exited with code 7"),
    "sigkill": (RankFailure, "SIGKILL"),
    "segfault": (RankFailure, "SIGSEGV"),
    "hang-outside": (WorldTimeout, "_barrier_unless_1"),
    "hang-inside": (WorldTimeout, "barrier"),
}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def faulted_pool(request, tmp_path_factory):
    """A gloo pool whose temporary folders are made in a folder of its own; on teardown, the pool
    closes and the test checks that no rank process and no temporary folder is left."""
    from distcheck.runners import RankPool

    folder = tmp_path_factory.mktemp(f"pool-{request.param}")
    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    pool = RankPool(request.param, backend="gloo", timeout_s=30)
    every_pid: set[int] = set()
    try:
        pool.start()
        yield pool, folder, every_pid
    finally:
        every_pid.update(pool.pids)
        pool.close()
        tempfile.tempdir = saved
    assert _wait_gone(every_pid) == [], "a rank outlived the pool"
    assert list(folder.iterdir()) == [], "the pool left a temporary folder"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_is_labelled_and_the_pool_is_reusable(faulted_pool, fault):
    pool, folder, every_pid = faulted_pool
    n = pool.world_size
    before = pool.pids
    every_pid.update(before)
    kind, text = FAULTS[fault]
    with pytest.raises(kind) as info:
        pool.run(_barrier_unless_1, fault, timeout_s=HANG_TIMEOUT_S if kind is WorldTimeout else None)
    err = info.value
    if kind is RankFailure:
        assert err.rank == 1 and text in err.traceback_text, err.traceback_text[-1500:]
    else:
        assert 1 in err.ranks and err.timeout_s == HANG_TIMEOUT_S
        assert text in err.stacks[1], err.stacks.get(1, "")[-1500:]
        if fault == "hang-outside":
            assert all("barrier" in err.stacks[r] for r in err.ranks if r != 1)  # the others wait in it
    assert "rank 1" in str(err)
    assert _wait_gone(before) == [], "the faulted world's ranks must be gone"  # torn down, none orphaned
    assert pool.run(_sum_of_ranks) == [float(n * (n - 1) // 2)] * n  # reusable at once
    every_pid.update(pool.pids)
    assert len([p for p in folder.iterdir() if p.name.startswith("distcheck-pool")]) <= 1  # the live world's only
