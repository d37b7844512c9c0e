"""What runs inside a rank: set-up, the task loop, and the guard that takes descendants along.

:func:`child_main` is the entry point of every child a :class:`~distcheck.runners.pool.RankPool`
starts: one process per rank (gloo, nccl) or the threaded host
(:mod:`distcheck.runners.threaded_host`). In order, a child

1. ties its life, and its descendants', to the parent's (:func:`become_child`): a process
   group of its own, ``PR_SET_PDEATHSIG`` and ``PR_SET_CHILD_SUBREAPER`` (Linux), a guard
   process, SIGINT ignored and SIGTERM at its default action;
2. points ``faulthandler`` at its dump file (for crashes and for ``SIGUSR1``, which the
   parent sends to a stuck rank) and sets the pool's environment variables; a failure
   here is reported to the parent with the rank's traceback;
3. joins the world and serves the parent's tasks (:mod:`distcheck.runners.protocol`);
4. on its way out, kills and reaps every descendant (:func:`kill_descendants`).

No descendant outlives the pool on Linux:

* each rank leads a process group of its own, which everything it starts inherits, and a
  terminal's Ctrl-C reaches only the parent;
* the kernel kills a rank when its parent dies (``PR_SET_PDEATHSIG``), and a rank is a
  child subreaper (orphaned descendants re-parent to it, not to init);
* each rank's first child is a *guard* (:func:`guard`) that does nothing until the rank
  dies, however it dies, then kills the rank's whole process group;
* the parent kills each rank's process group before reaping the rank;
* a rank that exits by itself first kills and reaps its descendants, including those in
  a session or group of their own.

A descendant that leaves the rank's process group (``setsid``,
``start_new_session=True``) is beyond the group kill: it dies when its rank exits by
itself, but not when the rank is SIGKILLed. ``PR_SET_PDEATHSIG`` fires when the parent
*thread* that started the world exits: start pools from a thread that outlives them.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import time
import traceback
from typing import Any

from distcheck.runners.folders import remove_folder_of_dead_owner
from distcheck.runners.procfs import children
from distcheck.runners.protocol import init_torch_child, run_one, send, send_warned, tasks
from distcheck.runners.warned import catch_in_rank

__all__ = ["GUARD_OWNER_WAIT_S", "GUARD_POLL_S", "REAP_WAIT_S", "become_child", "child_main", "guard",
           "kill_descendants"]

#: how long (seconds) a rank that exits by itself spends killing and reaping its descendants
REAP_WAIT_S = 1.0
#: a rank's guard re-checks that its rank is alive at least this often (seconds), should the
#: kernel's parent-death signal be missed
GUARD_POLL_S = 1.0
#: after its rank died, how long (seconds) a guard waits to see the pool's parent dead before it
#: leaves the pool's folder to the parent (alive: it cleans up itself) or to the next sweep
GUARD_OWNER_WAIT_S = 0.2

LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: the parent-death signal of a rank's guard: sent by the kernel when the rank dies
_GUARD_SIGNAL = signal.SIGUSR2


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` through libc (Linux); False when it failed or is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                              ctypes.c_ulong(0))) == 0
    except (OSError, AttributeError):
        return False


def become_child(parent_pid: int, folder: str | None) -> int | None:
    """First thing a rank does: tie its life, and its descendants', to the parent's.

    * Leave the terminal's process group for a group of its own (led by the rank,
      inherited by everything it starts), so a terminal's Ctrl-C reaches only the parent
      and the whole group can be killed at once.
    * Linux: ``PR_SET_PDEATHSIG(SIGKILL)`` (the kernel kills the rank when the parent
      thread that started it exits, even by SIGKILL); ``PR_SET_CHILD_SUBREAPER`` (a
      descendant whose parent exits is re-parented to the rank, not to init, so the
      rank can still find it); and a guard process (:func:`guard`) that kills the
      rank's process group when the rank dies, however it dies.
    * Ignore SIGINT; SIGTERM back to its default action (not the parent's handler).

    Returns the guard's pid (None off Linux, or when it could not be forked). Exits
    (code 1) when the parent is already gone.
    """
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    guard_pid = None
    if LINUX:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        guard_pid = _start_guard(folder)
    elif os.getppid() != parent_pid:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return guard_pid


def _start_guard(folder: str | None) -> int | None:
    """Fork this rank's guard (Linux); return its pid, or None if fork failed.

    Called while the rank is single-threaded, before it runs anything else.
    """
    rank_pid = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        return pid
    try:
        guard(rank_pid, folder)
    finally:
        os._exit(0)


def guard(rank_pid: int, folder: str | None) -> None:
    """A rank's guard: wait for the rank to die, then kill every process left in its group.

    The guard is the rank's first child and stays in the rank's process group, so
    the group's id cannot be reused while the guard lives. It holds no descriptor
    of the world (the parent's sentinels and pipes see the rank's death at once),
    ignores the signals a group may get, and learns of the rank's death from its
    own parent-death signal (or, failing that, by polling ``getppid``). Then:

    1. if the pool's parent is dead too (SIGKILL, SIGTERM's default action: it ran no
       clean-up), it removes the pool's folder (the owner marker decides, as in
       :func:`~distcheck.runners.folders.sweep_stale_folders`);
    2. it sends SIGKILL to the rank's process group: every descendant that stayed in
       it (the default for ``subprocess``, ``os.fork`` and ``multiprocessing``), and
       itself.
    """
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2:
                with contextlib.suppress(OSError):
                    os.close(int(name))
    except OSError:
        pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {_GUARD_SIGNAL})
    _prctl(_PR_SET_PDEATHSIG, _GUARD_SIGNAL)
    while os.getppid() == rank_pid:
        signal.sigtimedwait({_GUARD_SIGNAL}, GUARD_POLL_S)
    if folder is not None:
        remove_folder_of_dead_owner(folder, GUARD_OWNER_WAIT_S)
    with contextlib.suppress(OSError):  # the rank could not lead a group of its own: nothing to kill by group
        os.killpg(rank_pid, signal.SIGKILL)


def kill_descendants(keep: int | None, wait_s: float = REAP_WAIT_S) -> None:
    """Kill and reap every descendant of this process except ``keep`` (its guard); Linux, best effort.

    This process is a subreaper, so its descendants are its children or become its
    children as their parents die: killing its children, reaping them and
    repeating reaches them all, including those in a session of their own. Only
    unreaped children are signalled, so a recycled pid is never hit.
    """
    me = os.getpid()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        kids = [k for k in children(me) if k != keep]
        if not kids:
            return
        for k in kids:
            with contextlib.suppress(OSError):
                os.kill(k, signal.SIGKILL)
        pending = set(kids)
        while pending and time.monotonic() < deadline:
            for k in list(pending):
                try:
                    done, _ = os.waitpid(k, os.WNOHANG)
                except ChildProcessError:
                    done = k
                if done:
                    pending.discard(k)
            if pending:
                time.sleep(0.005)


def child_main(conn: Any, spec: dict[str, Any]) -> None:
    """Entry point of a rank process (gloo, nccl) or of the threaded host; never returns.

    ``spec`` is the pool's description of the child: ``rank`` (its first rank),
    ``world_size``, ``backend``, ``parent_pid``, ``folder`` (the pool's folder),
    ``store_path`` (the ``FileStore``), ``dump_path`` (faulthandler's file),
    ``pg_timeout_s``, ``env`` and ``startup_deadline`` (``time.monotonic()`` seconds).
    """
    guard_pid = become_child(spec["parent_pid"], spec.get("folder"))
    try:
        dump = open(spec["dump_path"], "a", buffering=1)  # lives as long as the process
        faulthandler.enable(file=dump, all_threads=True)
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True, chain=False)
        os.environ.update(spec.get("env") or {})
        catch_in_rank(spec["rank"])  # warnings go to the parent's summary, not between its progress lines
    except BaseException:  # noqa: BLE001 - reported to the parent, labelled with the rank(s)
        ranks = range(spec["world_size"]) if spec["backend"] == "threaded" else [spec["rank"]]
        try:
            send(conn, ("fail", [(r, "err", traceback.format_exc(), None) for r in ranks]))
        finally:
            os._exit(1)
    try:
        if spec["backend"] == "threaded":
            from distcheck.runners.threaded_host import threaded_host

            threaded_host(conn, spec)
        else:
            _process_rank(conn, spec)
    except (EOFError, OSError):
        pass  # the parent went away
    finally:
        try:
            if LINUX:
                kill_descendants(keep=guard_pid)
        finally:
            os._exit(0)


def _process_rank(conn: Any, spec: dict[str, Any]) -> None:
    """One rank of a process world (gloo, nccl): join through the pool's ``FileStore``, then serve tasks."""
    rank, world_size, backend = spec["rank"], spec["world_size"], spec["backend"]
    try:
        init_torch_child()
        catch_in_rank(rank)  # again: a spawned rank imported torch (and its logging handlers) just now
        import datetime

        import torch
        import torch.distributed as dist

        from distcheck.engine.world import RankContext

        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        store = dist.FileStore(spec["store_path"], world_size)
        extra: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=spec["pg_timeout_s"]), **extra,
        )
        ctx = RankContext(rank=rank, world_size=world_size, backend=backend, device=device, local_rank=rank)
    except BaseException:  # noqa: BLE001 - reported to the parent, labelled with the rank
        send(conn, ("fail", [(rank, "err", traceback.format_exc(), None)]))
        return
    send_warned(conn)
    send(conn, ("ready", None))
    for seq, fn, args_list, _timeout in tasks(conn):
        item = run_one(fn, ctx, args_list[0])
        send_warned(conn)
        send(conn, (seq, [(rank, *item)]))
