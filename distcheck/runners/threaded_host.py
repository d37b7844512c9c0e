"""The threaded backend's host: every rank of a world is a thread of this one forked process.

:func:`threaded_host` runs inside the child a :class:`~distcheck.runners.pool.RankPool`
with ``backend="threaded"`` forks (:func:`distcheck.runners.child.child_main` calls it).
It installs torch's in-memory process group
(``torch.testing._internal.distributed.multi_threaded_pg``), starts one thread per rank,
and serves the parent's tasks with the protocol of :mod:`distcheck.runners.protocol`,
answering for all its ranks at once. When one rank raises while others are blocked in
a collective, it stops the blocked ranks (reported as ``"stopped"``) and exits, so the
parent starts a fresh world. What a rank function must know about this backend is in
:mod:`distcheck.runners.threaded`.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

from distcheck.runners.protocol import (
    FAILURE_GRACE_S,
    init_torch_child,
    run_one,
    send,
    send_warned,
    tasks,
)
from distcheck.runners.warned import catch_in_rank

__all__ = ["threaded_host"]

_STOPPED = "stopped by the threaded backend after another rank failed"
#: the line a rank thread's ``os._exit`` leaves in the host's dump file (read by :func:`workers.death_text`)
EXIT_MARK = "distcheck: threaded rank {rank} called os._exit({code})"


def _name_exiting_ranks(dump_path: str | None) -> None:
    """Make ``os._exit`` called from a rank thread write ``EXIT_MARK`` to the dump file first, so that
    the parent can name the rank that ended the whole host (this forked process is the host alone)."""
    real_exit = os._exit

    def named_exit(status: int) -> NoReturn:
        name = threading.current_thread().name
        if dump_path and name.startswith("rank-"):
            try:
                fd = os.open(dump_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                os.write(fd, (EXIT_MARK.format(rank=name[5:], code=status) + "\n").encode())
                os.close(fd)
            except OSError:
                pass
        real_exit(status)

    os._exit = named_exit


def threaded_host(conn: Any, spec: dict[str, Any]) -> None:
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
    world_size = spec["world_size"]
    _name_exiting_ranks(spec.get("dump_path"))
    try:
        init_torch_child()
        import torch
        import torch.distributed as dist
        from torch.testing._internal.distributed.multi_threaded_pg import (
            ProcessLocalGroup,
            _install_threaded_pg,
        )

        from distcheck.engine.world import RankContext

        # group names are registered per thread (as torch's MultiThreadedTestCase does)
        torch._C._distributed_c10d._set_thread_isolation_mode(True)  # type: ignore[attr-defined]
        _install_threaded_pg()
        store = dist.HashStore()
        catch_in_rank(0)  # each rank thread's warnings are its own ("rank-N" threads)
    except BaseException:  # noqa: BLE001 - reported to the parent
        send(conn, ("fail", [(0, "err", traceback.format_exc(), None)]))
        return

    outbox: queue.Queue = queue.Queue()
    inboxes: list[queue.Queue] = [queue.Queue() for _ in range(world_size)]

    def rank_thread(rank: int) -> None:
        try:
            dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            ctx = RankContext(rank=rank, world_size=world_size, backend="threaded",
                              device=torch.device("cpu"), local_rank=rank)
        except BaseException:  # noqa: BLE001 - reported to the parent with the rank
            outbox.put((None, rank, ("err", traceback.format_exc(), None)))
            return
        outbox.put((None, rank, ("ready", None, None)))
        while True:
            task = inboxes[rank].get()
            if task is None:
                return
            seq, fn, args = task
            item = run_one(fn, ctx, args)
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
            send(conn, ("startup_timeout", [(r, "timeout", _thread_stack(threads[r], frames), None)
                                             for r in range(world_size) if r not in ready]))
            return
        ready[rank] = item
    failed = [(r, *item) for r, item in sorted(ready.items()) if item[0] != "ready"]
    if failed:
        send(conn, ("fail", failed))
        return
    send_warned(conn)
    send(conn, ("ready", None))

    for seq, fn, args_list, timeout_s in tasks(conn):
        for r in range(world_size):
            inboxes[r].put((seq, fn, args_list[r]))
        got, woke = _gather(outbox, seq, world_size, timeout_s, FAILURE_GRACE_S, ProcessLocalGroup)
        frames = sys._current_frames()
        replies = [(r, *got[r]) if r in got else (r, "timeout", _thread_stack(threads[r], frames), None)
                   for r in range(world_size)]
        send_warned(conn)
        send(conn, (seq, replies))
        if woke or len(got) < world_size:
            return  # the world is broken: exit so that the parent starts a fresh one


def _thread_stack(thread: threading.Thread, frames: dict[int, Any]) -> str:
    """The Python stack of a rank thread (``frames`` from ``sys._current_frames()``), most recent call last."""
    frame = frames.get(thread.ident) if thread.ident is not None else None
    stack = "".join(traceback.format_stack(frame)) if frame is not None else "(thread has ended)\n"
    return f"Thread {thread.name} (most recent call last):\n{stack}"


def _gather(outbox: queue.Queue, seq: int, world_size: int, timeout_s: float, grace_s: float,
            pg_cls: Any) -> tuple[dict[int, tuple], bool]:
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
