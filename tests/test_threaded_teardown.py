"""The threaded backend after a fault: the rank that called ``os._exit`` is the rank named (not rank 0
of the host), and a torn-down world gives back its file descriptors at teardown (not when the garbage
collector runs), however many faults a pool goes through."""

from __future__ import annotations

import gc
import os

import pytest

from distcheck.core.errors import RankFailure
from distcheck.runners.pool import RankPool

pytestmark = [pytest.mark.multiprocess, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]


def _exit_on_3(ctx):
    if ctx.rank == 3:
        os._exit(3)
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return 1


def _raise_on_1(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 fails")
    return 1


def _open_fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


def test_the_rank_that_called_os_exit_is_named():
    with RankPool(4, backend="threaded", timeout_s=30) as pool, pytest.raises(RankFailure) as info:
        pool.run(_exit_on_3)
    err = info.value
    assert err.rank == 3 and set(err.failures) == {3}, str(err)
    assert str(err).startswith("rank 3 failed:") and "exited with code 3" in str(err)
    assert "ranks [0, 1, 2] had not finished" in str(err)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc")
def test_repeated_faults_do_not_grow_the_parents_descriptors():
    gc_was = gc.isenabled()
    gc.disable()  # what teardown frees, not what the garbage collector would
    try:
        with RankPool(4, backend="threaded", timeout_s=30) as pool:
            for fn in (_exit_on_3, _raise_on_1):
                with pytest.raises(RankFailure):
                    pool.run(fn)
            pool.restart()
            before = _open_fds()
            for i in range(12):
                with pytest.raises(RankFailure):
                    pool.run(_exit_on_3 if i % 2 else _raise_on_1)
            pool.restart()
            assert _open_fds() == before
    finally:
        if gc_was:
            gc.enable()


def _kill_host_on_2(ctx):
    if ctx.rank == 2:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    import time

    time.sleep(5)
    return 1


def test_a_host_that_died_another_way_says_the_rank_is_unknown():
    with RankPool(4, backend="threaded", timeout_s=30) as pool, pytest.raises(RankFailure) as info:
        pool.run(_kill_host_on_2)
    assert "threaded host of ranks 0..3 was killed by SIGKILL; which rank ended it is unknown" in str(info.value)
