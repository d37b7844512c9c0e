"""The threaded backend: every rank of a world is a thread of one forked host process.

torch ships an in-memory process group for its own tests
(``torch.testing._internal.distributed.multi_threaded_pg``): collectives are
real (they move and reduce the actual tensors) but go through shared memory
under a lock, about 20x faster than gloo on this machine, and a world of
hundreds of ranks costs only threads. Use it through the pool::

    with RankPool(world_size=64, backend="threaded") as pool:
        pool.run(fn, example)

or :func:`threaded_pool`. Differences from a process world, by design of the
torch backend:

* all ranks share one process, hence one global RNG: build inputs from explicit
  ``torch.Generator`` objects (:func:`rank_generator`) or from numpy seeds;
* no point-to-point ``send``/``recv``;
* autograd's multithreading is disabled in the host (torch requires it);
* when one rank raises while others are blocked in a collective, the backend
  stops the blocked ranks (they are reported as stopped) and the world is rebuilt.

The host lives in its own forked process, so a hung world can be killed and
the caller's process never has torch's threaded world installed in it.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING

from distcheck.validate import check_int

if TYPE_CHECKING:
    import torch

    from distcheck.runners.context import RankContext
    from distcheck.runners.pool import RankPool

__all__ = ["threaded_pool", "rank_generator", "threaded_host"]

_STOPPED = "stopped by the threaded backend after another rank failed"


def threaded_pool(world_size: int, timeout_s: float = 60.0) -> RankPool:
    """A :class:`~distcheck.runners.pool.RankPool` on the threaded backend (same argument checks)."""
    from distcheck.runners.pool import RankPool

    return RankPool(world_size, backend="threaded", timeout_s=timeout_s)


def rank_generator(ctx: RankContext, seed: int) -> torch.Generator:
    """A ``torch.Generator`` seeded from ``(seed, ctx.rank)``, independent of the global RNG.

    Under the threaded backend the global RNG is shared by all ranks, so
    ``torch.manual_seed`` on one rank changes the others' draws; draw from this
    generator instead. The seed is ``seed * 1_000_003 + rank`` (distinct per rank).
    ``seed`` is an int in ``[0, 2**32)``; anything else raises ConfigError.
    """
    import torch

    check_int("seed", seed, min_value=0, max_value=2**32 - 1)
    rank = check_int("ctx.rank", getattr(ctx, "rank", None), min_value=0)
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed) * 1_000_003 + rank)
    return g


def threaded_host(conn, spec: dict) -> None:
    """Serve a threaded world over ``conn`` (called in the forked host process by the pool).

    Protocol (shared with process ranks): answer ``("ready", None)`` or
    ``("fail", [(rank, "err", text, exc), ...])``, or, when the pool's
    ``spec["startup_deadline"]`` (``time.monotonic()`` seconds) passes first,
    ``("startup_timeout", [(rank, "timeout", stack, None), ...])`` for the ranks
    that did not come up; then for every task
    ``(seq, fn, args_list, timeout_s)`` answer ``(seq, [(rank, kind, payload, exc), ...])``
    with kind ``"ok"``, ``"err"``, ``"stopped"`` or ``"timeout"`` (payload: the
    rank's stack). Returns (the process then exits) once the world is broken.
    """
    from distcheck.runners.pool import FAILURE_GRACE_S, _init_torch_child, _run_one, _send, _tasks

    world_size = spec["world_size"]
    try:
        _init_torch_child()
        import torch
        import torch.distributed as dist
        from torch.testing._internal.distributed.multi_threaded_pg import (
            ProcessLocalGroup,
            _install_threaded_pg,
        )

        from distcheck.runners.context import RankContext

        # group names are registered per thread (as torch's MultiThreadedTestCase does)
        torch._C._distributed_c10d._set_thread_isolation_mode(True)  # type: ignore[attr-defined]
        _install_threaded_pg()
        store = dist.HashStore()
    except BaseException:  # noqa: BLE001 - reported to the parent
        _send(conn, ("fail", [(0, "err", traceback.format_exc(), None)]))
        return

    outbox: queue.Queue = queue.Queue()
    inboxes: list[queue.Queue] = [queue.Queue() for _ in range(world_size)]

    def rank_thread(rank: int) -> None:
        try:
            dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            ctx = RankContext(rank=rank, world_size=world_size, backend="threaded",
                              device=torch.device("cpu"), local_rank=rank)
        except BaseException:  # noqa: BLE001
            outbox.put((None, rank, ("err", traceback.format_exc(), None)))
            return
        outbox.put((None, rank, ("ready", None, None)))
        while True:
            task = inboxes[rank].get()
            if task is None:
                return
            seq, fn, args = task
            item = _run_one(fn, ctx, args)
            if item[0] == "err" and "SystemExit" in item[1] and "termination event" in item[1]:
                item = ("stopped", _STOPPED, None)
            outbox.put((seq, rank, item))

    threads = [threading.Thread(target=rank_thread, args=(r,), name=f"rank-{r}", daemon=True)
               for r in range(world_size)]
    for t in threads:
        t.start()
    ready: dict[int, tuple] = {}
    deadline = spec.get("startup_deadline")
    while len(ready) < world_size:
        try:
            _, rank, item = outbox.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:  # the pool's start-up deadline: name the ranks that did not come up
            frames = sys._current_frames()
            _send(conn, ("startup_timeout", [(r, "timeout", _thread_stack(threads[r], frames), None)
                                             for r in range(world_size) if r not in ready]))
            return
        ready[rank] = item
    failed = [(r, *item) for r, item in sorted(ready.items()) if item[0] != "ready"]
    if failed:
        _send(conn, ("fail", failed))
        return
    _send(conn, ("ready", None))

    for seq, fn, args_list, timeout_s in _tasks(conn):
        for r in range(world_size):
            inboxes[r].put((seq, fn, args_list[r]))
        got, woke = _gather(outbox, seq, world_size, timeout_s, FAILURE_GRACE_S, ProcessLocalGroup)
        frames = sys._current_frames()
        replies = [(r, *got[r]) if r in got else (r, "timeout", _thread_stack(threads[r], frames), None)
                   for r in range(world_size)]
        _send(conn, (seq, replies))
        if woke or len(got) < world_size:
            return  # the world is broken: exit so that the parent starts a fresh one


def _thread_stack(thread, frames: dict) -> str:
    """The Python stack of a rank thread (``frames`` from ``sys._current_frames()``), most recent call last."""
    frame = frames.get(thread.ident)
    stack = "".join(traceback.format_stack(frame)) if frame is not None else "(thread has ended)\n"
    return f"Thread {thread.name} (most recent call last):\n{stack}"


def _gather(outbox, seq, world_size, timeout_s, grace_s, pg_cls):
    """Collect the ranks' answers to ``seq``; returns (rank -> item, whether blocked ranks were woken)."""
    got: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout_s
    first_err = None
    woke = False
    while len(got) < world_size:
        limit = deadline if first_err is None else min(deadline, first_err + grace_s)
        try:
            tseq, rank, item = outbox.get(timeout=max(0.0, limit - time.monotonic()))
        except queue.Empty:
            if first_err is not None and not woke:
                pg_cls.exception_handle(None)  # make ranks blocked in collectives exit
                woke = True
                first_err = None
                deadline = min(deadline, time.monotonic() + 1.0)
                continue
            break
        if tseq != seq:
            continue
        got[rank] = item
        if item[0] != "ok" and first_err is None:
            first_err = time.monotonic()
    return got, woke
