"""A persistent pool of ranks that runs rank functions on a real torch.distributed world.

    from distcheck.runners import RankPool
    with RankPool(world_size=4, backend="gloo", timeout_s=60) as pool:
        results = pool.run(fn, *args)          # fn(ctx, *args) on every rank
        # results == [result of rank 0, result of rank 1, ...]

How it works (details in docs/RUNNERS.md):

* ``gloo``: one forked process per rank (forked worlds start in tens of
  milliseconds; spawned ones take seconds). Each child sets
  ``torch.set_num_threads(1)`` before anything else (a child forked after the
  parent ran a matmul can otherwise hang in its first matmul) and joins the world
  through a ``FileStore`` in the pool's private temporary directory: no port is
  fixed, so pools are safe under pytest-xdist.
* ``nccl``: one *spawned* process per GPU (CUDA cannot be used in a forked
  child), rank ``r`` on ``cuda:r``. Without enough GPUs, :class:`RankPool`
  raises :class:`~distcheck.errors.BackendUnavailable` in the constructor,
  before anything is started.
* ``threaded``: torch's in-memory threaded process group
  (``torch.testing._internal.distributed.multi_threaded_pg``): one forked host
  process runs every rank as a thread. Collectives are real and ~20x faster
  than gloo, worlds of hundreds of ranks are cheap, but all ranks share one
  random number generator (build inputs from explicit ``torch.Generator``\\ s)
  and there is no send/recv.

The world persists across :meth:`RankPool.run` calls. A run that fails (a rank
raised while others were stuck, a rank died, or the step timed out) tears the
world down; the next run starts a fresh one.

Failure reporting:

* a rank raises -> :class:`~distcheck.errors.RankFailure` (rank, traceback text);
  the original exception is chained as ``__cause__`` when it can be unpickled;
  ``failure.failures`` maps every failed rank to its traceback text.
* a rank dies (segfault, ``os._exit``) -> ``RankFailure`` for that rank, with its
  exit code or signal and whatever ``faulthandler`` wrote on the way down.
* a step does not finish in ``timeout_s`` -> :class:`~distcheck.errors.WorldTimeout`
  carrying the Python stacks of the stuck ranks (``.stacks``: rank -> text,
  ``.ranks``), dumped by ``faulthandler`` on ``SIGUSR1``; it is raised at most a
  few seconds after the timeout.

Temporary files: each pool keeps its rendezvous store and faulthandler dumps
in a private folder ``<tmp>/distcheck-pool-*`` with an ``owner`` marker (pid,
process start time, host, pid namespace). ``close()``, garbage collection and
interpreter exit remove it. A parent stopped by a signal that runs no Python
clean-up (SIGTERM's default action, SIGKILL) cannot; on Linux the ranks' guards
(below) remove it once the parent is dead, and as a backstop every pool first
removes the folders of dead owners in its temporary root
(:func:`sweep_stale_folders`). The pool installs no signal handler.

No descendant outlives the pool on Linux. (Elsewhere the parent still kills each
rank's process group on close, garbage collection and interpreter exit, but
nothing kills the ranks of a parent that was SIGKILLed.) How:

* each rank (or threaded host) leads a process group of its own, which everything
  it starts inherits, and a terminal's Ctrl-C reaches only the parent;
* each rank asks the kernel to kill it when its parent dies
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) and is a child subreaper
  (``PR_SET_CHILD_SUBREAPER``: orphaned descendants re-parent to it, not to init);
* each rank's first child is a *guard* that does nothing until the rank dies,
  however it dies (the parent SIGKILLed, a crash, a kill by the parent), then
  kills the rank's whole process group;
* the parent kills each rank's process group before reaping the rank (close, a
  failed step, garbage collection, interpreter exit);
* a rank that exits by itself (close) first kills and reaps its descendants,
  including those in a session or group of their own.

A descendant that leaves the rank's process group (``setsid``,
``start_new_session=True``) is beyond the group kill: it dies when its rank exits
by itself, but not when the rank is SIGKILLed (a timeout, Ctrl-C, a dead
parent). ``PR_SET_PDEATHSIG`` fires when the parent *thread* that started the
world exits: start pools from a thread that outlives them.

This module imports torch only when a world is started.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from distcheck.errors import (
    BackendUnavailable,
    ConfigError,
    DistributedError,
    RankFailure,
    WorldTimeout,
    check_choice,
    check_positive_int,
)
from distcheck.validate import check_callable, check_float, check_type

__all__ = ["RankPool", "BACKENDS", "MAX_TIMEOUT_S", "check_backend_available", "check_timeout", "sweep_stale_folders"]

#: backends a RankPool can run
BACKENDS = ("gloo", "nccl", "threaded")

#: the longest timeout (seconds) a pool step, a pool start-up, a torchrun world and
#: ``distcheck check --timeout`` accept: one day. Longer waits are refused as bad input
#: (the platform's own limits, e.g. ``threading.TIMEOUT_MAX`` and ``select``'s, are far larger
#: than this on Linux but not everywhere).
MAX_TIMEOUT_S = min(86_400.0, threading.TIMEOUT_MAX)

#: after the first failure, how long (seconds) to wait for the other ranks to answer
#: before the world is declared broken and torn down
FAILURE_GRACE_S = 0.3
#: how long (seconds) to wait for a stuck rank's faulthandler dump after SIGUSR1
STACK_DUMP_WAIT_S = 2.0
#: a threaded host answers by itself at the timeout; the parent's hard limit is this much later
THREADED_HARD_MARGIN_S = 5.0
#: how long close() lets children exit by themselves before killing them
CLOSE_WAIT_S = 2.0
#: at start-up the threaded host reports its ranks that did not come up at the deadline;
#: the parent waits this much longer for that report before dumping the host's stacks itself
THREADED_STARTUP_MARGIN_S = 1.0
#: prefix of a pool's private temporary folder, and the owner marker file inside it
TMP_PREFIX = "distcheck-pool-"
OWNER_FILE = "owner"

#: how long (seconds) a rank that exits by itself spends killing and reaping its descendants
REAP_WAIT_S = 1.0
#: a rank's guard re-checks that its rank is alive at least this often (seconds), should the
#: kernel's parent-death signal be missed
GUARD_POLL_S = 1.0
#: after its rank died, how long (seconds) a guard waits to see the pool's parent dead before it
#: leaves the pool's folder to the parent (alive: it cleans up itself) or to the next sweep
GUARD_OWNER_WAIT_S = 0.2

_SHUTDOWN = b""
_LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: the parent-death signal of a rank's guard: sent by the kernel when the rank dies
_GUARD_SIGNAL = signal.SIGUSR2


# --------------------------------------------------------------------------- checks


def check_backend_available(backend: str, world_size: int) -> None:
    """Raise :class:`BackendUnavailable` unless ``backend`` can run ``world_size`` ranks here.

    Decided in the calling (parent) process, before anything is started: NCCL
    needs ``torch.cuda.device_count() >= world_size`` and an NCCL build; gloo
    needs a gloo build; the threaded backend needs torch's testing helpers.
    Imports torch.
    """
    check_choice("backend", backend, BACKENDS)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:  # pragma: no cover - torch is a declared extra
        raise BackendUnavailable(f"backend {backend!r} needs torch: {exc}") from None
    if not dist.is_available():
        raise BackendUnavailable("this torch build has no torch.distributed")
    if backend == "gloo" and not dist.is_gloo_available():
        raise BackendUnavailable("this torch build has no gloo backend")
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise BackendUnavailable("this torch build has no NCCL backend")
        if not torch.cuda.is_available():
            raise BackendUnavailable("backend 'nccl' needs CUDA GPUs; none is visible")
        have = torch.cuda.device_count()
        if have < world_size:
            raise BackendUnavailable(f"backend 'nccl' needs world_size={world_size} GPUs; {have} visible")
    if backend == "threaded":
        try:
            importlib.import_module("torch.testing._internal.distributed.multi_threaded_pg")
        except Exception as exc:  # noqa: BLE001 - any import failure means unavailable
            raise BackendUnavailable(f"threaded backend unavailable: {exc}") from None


# --------------------------------------------------------------------------- child side


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` through libc (Linux); False when it failed or is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                              ctypes.c_ulong(0))) == 0
    except (OSError, AttributeError):
        return False


def _become_child(parent_pid: int, folder: str | None) -> int | None:
    """First thing a rank does: tie its life, and its descendants', to the parent's.

    * Leave the terminal's process group for a group of its own (led by the rank,
      inherited by everything it starts), so a terminal's Ctrl-C reaches only the parent
      and the whole group can be killed at once.
    * Linux: ``PR_SET_PDEATHSIG(SIGKILL)`` (the kernel kills the rank when the parent
      thread that started it exits, even by SIGKILL); ``PR_SET_CHILD_SUBREAPER`` (a
      descendant whose parent exits is re-parented to the rank, not to init, so the
      rank can still find it); and a guard process (:func:`_guard`) that kills the
      rank's process group when the rank dies, however it dies.
    * Ignore SIGINT; SIGTERM back to its default action (not the parent's handler).

    Returns the guard's pid (None off Linux, or when it could not be forked).
    """
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    guard = None
    if _LINUX:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        guard = _start_guard(folder)
    elif os.getppid() != parent_pid:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return guard


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
        _guard(rank_pid, folder)
    finally:
        os._exit(0)


def _guard(rank_pid: int, folder: str | None) -> None:
    """A rank's guard: wait for the rank to die, then kill every process left in its group.

    The guard is the rank's first child and stays in the rank's process group, so
    the group's id cannot be reused while the guard lives. It holds no descriptor
    of the world (the parent's sentinels and pipes see the rank's death at once),
    ignores the signals a group may get, and learns of the rank's death from its
    own parent-death signal (or, failing that, by polling ``getppid``). Then:

    1. if the pool's parent is dead too (SIGKILL, SIGTERM's default action: it ran no
       clean-up), it removes the pool's folder (the owner marker decides, as in
       :func:`sweep_stale_folders`);
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
                try:
                    os.close(int(name))
                except OSError:
                    pass
    except OSError:
        pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {_GUARD_SIGNAL})
    _prctl(_PR_SET_PDEATHSIG, _GUARD_SIGNAL)
    while os.getppid() == rank_pid:
        signal.sigtimedwait({_GUARD_SIGNAL}, GUARD_POLL_S)
    if folder is not None:
        _remove_folder_of_dead_owner(folder, GUARD_OWNER_WAIT_S)
    try:
        os.killpg(rank_pid, signal.SIGKILL)
    except OSError:  # the rank could not lead a group of its own: nothing to kill by group
        pass


def _remove_folder_of_dead_owner(folder: str, wait_s: float) -> bool:
    """Remove ``folder`` if its owner marker names a dead process, waiting up to ``wait_s`` for it to die."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(os.path.join(folder, OWNER_FILE)) as f:
                line = f.read()
        except OSError:
            return False  # gone already, or never marked
        if _owner_is_dead(line):
            shutil.rmtree(folder, ignore_errors=True)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from ``/proc``; zombies included)."""
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _proc_stat(int(name))
            if len(fields) > 1 and fields[1] == str(pid):
                kids.append(int(name))
    return kids


def _kill_descendants(keep: int | None, wait_s: float = REAP_WAIT_S) -> None:
    """Kill and reap every descendant of this process except ``keep`` (its guard); Linux, best effort.

    This process is a subreaper, so its descendants are its children or become its
    children as their parents die: killing its children, reaping them and
    repeating reaches them all, including those in a session of their own. Only
    unreaped children are signalled, so a recycled pid is never hit.
    """
    me = os.getpid()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        kids = [k for k in _children(me) if k != keep]
        if not kids:
            return
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
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


def _dumps_result(kind: str, payload: Any, exc: BaseException | None = None) -> tuple:
    """(kind, payload, pickled exception or None); payload must be picklable."""
    exc_bytes = None
    if exc is not None:
        try:
            exc_bytes = pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
            exc_bytes = None
    return (kind, payload, exc_bytes)


def _run_one(fn, ctx, args) -> tuple:
    try:
        result = fn(ctx, *args)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        return _dumps_result("err", traceback.format_exc(), exc)
    try:
        pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001
        return _dumps_result("err", f"result of rank {ctx.rank} is not picklable: {exc!r}\n")
    return ("ok", result, None)


def _send(conn, obj) -> None:
    conn.send_bytes(pickle.dumps(obj))


def _tasks(conn):
    """Yield the parent's tasks ``(seq, fn, args_list, timeout_s)`` until it sends the shutdown message."""
    while True:
        msg = conn.recv_bytes()
        if msg == _SHUTDOWN:
            return
        yield pickle.loads(msg)


def _child_main(conn, spec: dict) -> None:
    """Entry point of a rank process (gloo, nccl) or of the threaded host."""
    guard = _become_child(spec["parent_pid"], spec.get("folder"))
    try:
        dump = open(spec["dump_path"], "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        faulthandler.enable(file=dump, all_threads=True)
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True, chain=False)
        os.environ.update(spec.get("env") or {})
    except BaseException:  # noqa: BLE001 - reported to the parent, labelled with the rank(s)
        ranks = range(spec["world_size"]) if spec["backend"] == "threaded" else [spec["rank"]]
        try:
            _send(conn, ("fail", [(r, "err", traceback.format_exc(), None) for r in ranks]))
        finally:
            os._exit(1)
    try:
        if spec["backend"] == "threaded":
            from distcheck.runners.threaded import threaded_host

            threaded_host(conn, spec)
        else:
            _process_rank(conn, spec)
    except (EOFError, OSError):
        pass  # the parent went away
    finally:
        try:
            if _LINUX:
                _kill_descendants(keep=guard)
        finally:
            os._exit(0)


def _init_torch_child() -> None:
    import torch

    torch.set_num_threads(1)  # before any op: see the module docstring


def _process_rank(conn, spec: dict) -> None:
    rank, world_size, backend = spec["rank"], spec["world_size"], spec["backend"]
    try:
        _init_torch_child()
        import datetime

        import torch
        import torch.distributed as dist

        from distcheck.runners.context import RankContext

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
    except BaseException:  # noqa: BLE001
        _send(conn, ("fail", [(rank, "err", traceback.format_exc(), None)]))
        return
    _send(conn, ("ready", None))
    for seq, fn, args_list, _timeout in _tasks(conn):
        _send(conn, (seq, [(rank, *_run_one(fn, ctx, args_list[0]))]))


# --------------------------------------------------------------------------- temporary folders


def _proc_stat(pid: int) -> list[str]:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first); [] where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks), or None where unreadable."""
    fields = _proc_stat(pid)
    return fields[19] if len(fields) > 19 else None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def _owner_line(pid: int) -> str:
    """``pid start_time host pid_namespace``: who owns a pool folder, robust to pid reuse."""
    return f"{pid} {_proc_start_time(pid) or '-'} {os.uname().nodename} {_pid_namespace()}\n"


def _owner_is_dead(line: str) -> bool:
    """True only when the marker names a process of this host and pid namespace that is gone.

    Gone means: no such pid, a zombie, or a pid reused by a process that
    started at another time. A marker from another host or pid namespace (a
    shared /tmp between containers) is never judged dead.
    """
    parts = line.split()
    if len(parts) != 4 or not parts[0].isdigit():
        return False
    pid, start, host, ns = int(parts[0]), parts[1], parts[2], parts[3]
    if host != os.uname().nodename or ns != _pid_namespace():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    except OSError:
        return False
    if _proc_stat(pid)[:1] == ["Z"]:
        return True
    now = _proc_start_time(pid)
    return start != "-" and now is not None and now != start


def sweep_stale_folders(root: str | None = None) -> list[str]:
    """Remove pool folders under ``root`` whose owner process is dead; return their paths.

    ``root`` defaults to :func:`tempfile.gettempdir` (where pools create their
    folders). A folder qualifies when its name starts with ``distcheck-pool-``,
    it belongs to this user, and its ``owner`` marker (written by the pool that
    made it: pid, process start time, host, pid namespace) names a dead process
    of this host and pid namespace. Folders without a marker (being created
    right now, or made by an older version) are left alone. A pool calls this
    when it makes its own folder, so a parent stopped by a signal that skips
    clean-up (SIGTERM's default action, SIGKILL) leaves its folder only until
    the next pool starts in the same temporary root. Never raises for a folder
    it cannot read or remove.
    """
    root = tempfile.gettempdir() if root is None else root
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(root) if n.startswith(TMP_PREFIX)]
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for name in names:
        path = os.path.join(root, name)
        try:
            if uid is not None and os.stat(path).st_uid != uid:
                continue
            with open(os.path.join(path, OWNER_FILE)) as f:
                line = f.read()
        except OSError:
            continue
        if _owner_is_dead(line):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _make_pool_folder() -> str:
    """A private folder with its owner marker; first removes dead pools' folders."""
    sweep_stale_folders()
    path = tempfile.mkdtemp(prefix=TMP_PREFIX)
    partial = os.path.join(path, OWNER_FILE + ".partial")
    with open(partial, "w") as f:
        f.write(_owner_line(os.getpid()))
    os.replace(partial, os.path.join(path, OWNER_FILE))  # a reader never sees half a marker
    return path


# --------------------------------------------------------------------------- parent side


@dataclass
class _Worker:
    proc: Any
    conn: Any
    ranks: list[int]
    dump_path: str
    dump_offset: int = 0


@dataclass
class _World:
    workers: list[_Worker] = field(default_factory=list)
    tmpdir: str | None = None

    def kill(self) -> None:
        """Kill every child by process group and reap it; never raises."""
        for w in self.workers:
            pid = w.proc.pid
            if pid is None:
                continue
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        for w in self.workers:
            try:
                w.proc.join(timeout=5)
            except Exception:  # noqa: BLE001
                pass
            try:
                w.conn.close()
            except Exception:  # noqa: BLE001
                pass
        self.workers = []

    def close(self) -> None:
        """Ask children to exit, wait up to CLOSE_WAIT_S, then kill what is left.

        Children are waited for without being reaped, so that :meth:`kill` still
        reaches each one's process group (its descendants) before reaping it.
        """
        for w in self.workers:
            try:
                w.conn.send_bytes(_SHUTDOWN)
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + CLOSE_WAIT_S
        sentinels = []
        for w in self.workers:
            try:
                sentinels.append(w.proc.sentinel)
            except Exception:  # noqa: BLE001 - a process object already closed
                pass
        while sentinels and (left := deadline - time.monotonic()) > 0:
            for ready in mpc.wait(sentinels, timeout=left):
                sentinels.remove(ready)
        self.kill()


def _cleanup(world: _World) -> None:
    world.kill()
    if world.tmpdir:
        shutil.rmtree(world.tmpdir, ignore_errors=True)
        world.tmpdir = None


def _exit_code(proc: Any, wait_s: float) -> int | None:
    """Exit code of an ended child (negative: the signal that killed it), waiting up to ``wait_s``.

    Read without reaping the child (``waitid(..., WNOWAIT)``) where the platform
    allows it, so that its process group can still be killed safely; None while
    it is still running.
    """
    deadline = time.monotonic() + wait_s
    # Process.exitcode would reap the child: read what multiprocessing already knows instead
    while hasattr(os, "waitid") and getattr(getattr(proc, "_popen", None), "returncode", None) is None:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break  # reaped already (its exitcode is known) or not our child
        if info is not None and info.si_pid == proc.pid:
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)
    proc.join(timeout=max(0.0, deadline - time.monotonic()))
    return proc.exitcode


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return ""


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


#: the most ranks one host may run per backend: gloo forks a process per rank (each
#: imports torch and holds its own buffers), threaded runs a thread per rank in one
#: process. Larger layouts belong on the fake backend (distcheck.runners.fake).
MAX_LOCAL_RANKS = {"gloo": 64, "threaded": 1024}


class RankPool:
    """A persistent world of ``world_size`` ranks that runs rank functions.

    Arguments:
        world_size: ranks in the world, >= 1 (``nccl``: at most the visible GPUs;
            gloo and threaded: at most :data:`MAX_LOCAL_RANKS`).
        backend: ``"gloo"`` (default; CPU, one forked process per rank),
            ``"nccl"`` (one spawned process per GPU, device ``cuda:rank``) or
            ``"threaded"`` (every rank a thread of one forked process).
        timeout_s: seconds a :meth:`run` may take before :class:`WorldTimeout`;
            also the process group's own collective timeout. A real number in
            ``(0, MAX_TIMEOUT_S]`` (at most one day). Default 60. The world's start-up (forking the children and their
            rendezvous, counted after the parent's one-time torch import) has
            the same budget: ``WorldTimeout`` naming the ranks that did not
            come up (``.ranks``, ``.stacks``) arrives within ``timeout_s`` plus
            the stack dump (at most 2 s; threaded: 1 s more for the host's
            own report).
        start_method: ``"fork"`` or ``"spawn"``; default fork for gloo/threaded and
            spawn for nccl (fork is refused for nccl).
        preload: a list or tuple of module names imported in the parent before
            forking so that children inherit them (e.g. ``("torch._dynamo",)``
            saves about a second per child on its first DDP). Ignored for spawn.
            A name that cannot be imported raises ConfigError when the world starts.
        env: environment variables set in each child, a dict of ``str`` to ``str``
            (the parent's ``os.environ`` is never changed), e.g.
            ``{"GLOO_SOCKET_IFNAME": "lo"}``.

    Raises:
        ConfigError: for a bad argument, naming it (``world_size``, ``backend``,
            ``timeout_s``, ``start_method``, ``preload[i]``, ``env[key]``...).
        BackendUnavailable: when the backend cannot run here (e.g. NCCL with
            fewer GPUs than ranks); decided before any process starts.

    The world starts on ``__enter__``/:meth:`start` or on the first :meth:`run`.
    A pool runs one step at a time (calls from several threads are serialised).
    """

    def __init__(
        self,
        world_size: int,
        backend: str = "gloo",
        timeout_s: float = 60.0,
        *,
        start_method: str | None = None,
        preload: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ):
        self.world_size = check_positive_int("world_size", world_size)
        self.backend = check_choice("backend", backend, BACKENDS)
        limit = MAX_LOCAL_RANKS.get(backend)
        if limit is not None and world_size > limit:
            raise ConfigError("world_size", world_size,
                              f"must be <= {limit} for backend={backend!r} on one host; use backend='threaded' "
                              "(up to 1024 ranks) or distcheck.runners.fake for larger worlds")
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        if start_method is None:
            start_method = "spawn" if backend == "nccl" else "fork"
        check_choice("start_method", start_method, ("fork", "spawn"))
        if backend == "nccl" and start_method == "fork":
            raise ConfigError("start_method", start_method, "must be 'spawn' for backend='nccl' (CUDA cannot fork)")
        if start_method == "fork" and not hasattr(os, "fork"):
            raise BackendUnavailable("fork is not available on this platform; use start_method='spawn'")
        self.start_method = start_method
        self.preload = _check_module_names("preload", preload)
        self.env = _check_env("env", env)
        check_backend_available(backend, world_size)
        self.generation = 0  #: how many worlds this pool has started
        self._world = _World()
        self._closed = False
        self._seq = 0
        self._lock = threading.RLock()
        self._finalizer = weakref.finalize(self, _cleanup, self._world)

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> "RankPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self.running else "idle")
        return f"RankPool(world_size={self.world_size}, backend={self.backend!r}, {state})"

    @property
    def running(self) -> bool:
        """True while a world is up."""
        return bool(self._world.workers)

    @property
    def pids(self) -> list[int]:
        """Process ids of the current world's children (empty when none is up)."""
        return [w.proc.pid for w in self._world.workers]

    def start(self) -> "RankPool":
        """Start the world now (otherwise the first :meth:`run` starts it)."""
        with self._lock:
            self._ensure_open()
            if not self.running:
                self._start_world()
        return self

    def close(self) -> None:
        """Stop the world and remove the pool's temporary files. Idempotent."""
        with self._lock:
            self._closed = True
            try:
                self._world.close()
            finally:
                self._finalizer()

    def restart(self) -> None:
        """Tear the world down; the next :meth:`run` starts a fresh one."""
        with self._lock:
            self._world.kill()

    # ------------------------------------------------------------ running

    def run(self, fn: Callable, *args, timeout_s: float | None = None) -> list:
        """Call ``fn(ctx, *args)`` on every rank; return ``[result of rank 0, ...]``.

        ``fn`` must be picklable (a module-level function) and so must ``args`` and
        the results. ``timeout_s`` overrides the pool's timeout for this call.

        Raises:
            RankFailure: a rank raised or died (the lowest-numbered rank that died,
                else the first that raised); ``.failures`` maps every failed rank
                to its text.
            WorldTimeout: the step did not finish in time; ``.stacks`` maps each
                stuck rank to its Python stack.
            ConfigError: ``fn`` is not callable, ``fn`` or ``args`` cannot be pickled, or
                ``timeout_s`` is not a number of seconds in ``(0, MAX_TIMEOUT_S]``.
        """
        return self.run_on(fn, [args] * self.world_size, timeout_s=timeout_s)

    def run_on(self, fn: Callable, args_per_rank: Sequence[Sequence], timeout_s: float | None = None) -> list:
        """Call ``fn(ctx, *args_per_rank[rank])`` on every rank; same contract as :meth:`run`.

        ``args_per_rank`` is a list or tuple of exactly ``world_size`` entries, each a tuple or list.
        """
        check_callable("fn", fn)
        check_type("args_per_rank", args_per_rank, (list, tuple), "must be a list with one tuple of arguments per rank")
        if len(args_per_rank) != self.world_size:
            raise ConfigError("args_per_rank", f"<{len(args_per_rank)} entries>",
                              f"must have world_size={self.world_size} entries")
        for r, rank_args in enumerate(args_per_rank):
            check_type(f"args_per_rank[{r}]", rank_args, (list, tuple), "must be a tuple or list of arguments")
        timeout = self.timeout_s if timeout_s is None else check_timeout("timeout_s", timeout_s)
        with self._lock:
            self._ensure_open()
            if not self.running:
                self._start_world()
            self._seq += 1
            seq = self._seq
            messages = []
            for w in self._world.workers:
                payload = (seq, fn, [tuple(args_per_rank[r]) for r in w.ranks], timeout)
                try:
                    messages.append(pickle.dumps(payload))
                except Exception as exc:  # noqa: BLE001
                    raise ConfigError("fn", getattr(fn, "__qualname__", fn),
                                      f"and its arguments must be picklable (a module-level function): {exc}") from None
            try:
                for w, msg in zip(self._world.workers, messages):
                    w.conn.send_bytes(msg)
                replies = self._collect(seq, timeout)
            except DistributedError:
                raise  # _collect already tore the world down if it was broken
            except BaseException:
                self._world.kill()  # Ctrl-C or a broken pipe: the world's state is unknown
                raise
            return [replies[r][1] for r in range(self.world_size)]

    # ------------------------------------------------------------ internals

    def _ensure_open(self) -> None:
        if self._closed:
            raise DistributedError(f"{self!r} is closed")

    def _start_world(self) -> None:
        import torch  # noqa: F401 - loaded once here so forked children inherit it
        import torch.distributed  # noqa: F401

        if self.start_method == "fork":
            for i, name in enumerate(self.preload):
                try:
                    importlib.import_module(name)
                except ModuleNotFoundError as exc:
                    if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                        raise ConfigError(f"preload[{i}]", name, "must name an importable module") from None
                    raise
        if self._world.tmpdir is None:
            self._world.tmpdir = _make_pool_folder()
        # start-up (forking the children and their rendezvous) is bounded by timeout_s from here
        deadline = time.monotonic() + self.timeout_s
        self.generation += 1
        gen = self.generation
        tmp = self._world.tmpdir
        ctx: Any = mp.get_context(self.start_method)
        groups = [list(range(self.world_size))] if self.backend == "threaded" else [[r] for r in range(self.world_size)]
        spec_common = {
            "world_size": self.world_size, "backend": self.backend, "parent_pid": os.getpid(),
            "store_path": os.path.join(tmp, f"store-{gen}"), "pg_timeout_s": max(self.timeout_s, 1.0),
            "env": self.env, "startup_deadline": deadline, "folder": tmp,
        }
        try:
            for k, ranks in enumerate(groups):
                if k and time.monotonic() > deadline:
                    self._startup_overrun(groups, k)
                dump_path = os.path.join(tmp, f"stacks-{gen}-rank{ranks[0]}.txt")
                parent_conn, child_conn = ctx.Pipe(duplex=True)
                spec = dict(spec_common, rank=ranks[0], dump_path=dump_path)
                proc = ctx.Process(target=_child_main, args=(child_conn, spec),
                                   name=f"distcheck-{self.backend}-rank{ranks[0]}")
                with warnings.catch_warnings():
                    # Python >= 3.12 warns when a multi-threaded process forks; the known
                    # hazard (a stale intra-op thread pool) is handled in the child
                    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks",
                                            category=DeprecationWarning)
                    proc.start()
                child_conn.close()
                try:
                    os.setpgid(proc.pid, proc.pid)  # also done by the child; whichever runs first
                except OSError:
                    pass
                self._world.workers.append(_Worker(proc, parent_conn, ranks, dump_path))
            margin = THREADED_STARTUP_MARGIN_S if self.backend == "threaded" else 0.0
            self._collect("ready", self.timeout_s, startup=True, deadline=deadline + margin)
        except BaseException:
            self._world.kill()
            raise

    def _startup_overrun(self, groups: list[list[int]], started: int) -> None:
        """Raise WorldTimeout: the deadline passed while forking (``started`` of ``len(groups)`` forked)."""
        ranks = list(range(self.world_size))
        not_forked = [r for g in groups[started:] for r in g]
        raise WorldTimeout(
            f"start-up did not finish within timeout_s={self.timeout_s:g} on backend {self.backend!r}: "
            f"ranks {ranks} did not come up (the time ran out while forking; ranks {not_forked} were not "
            "forked yet; the world was torn down)",
            ranks=ranks, stacks={}, timeout_s=self.timeout_s,
        )

    def _hard_limit(self, timeout: float) -> float:
        return timeout + (THREADED_HARD_MARGIN_S if self.backend == "threaded" else 0.0)

    def _collect(self, seq, timeout: float, startup: bool = False, deadline: float | None = None) -> dict[int, tuple]:
        """Wait for every worker's reply to ``seq``; return rank -> (kind, payload, exc).

        ``deadline`` (``time.monotonic()`` seconds) defaults to now plus the step's hard limit.
        """
        workers = self._world.workers
        by_obj: dict[Any, _Worker] = {}
        for w in workers:
            by_obj[w.conn] = w
            by_obj[w.proc.sentinel] = w
        pending = set(range(len(workers)))
        index = {id(w): i for i, w in enumerate(workers)}
        replies: dict[int, tuple] = {}
        deaths: dict[int, str] = {}
        first_failure: float | None = None
        if deadline is None:
            deadline = time.monotonic() + self._hard_limit(timeout)
        while pending:
            limit = deadline if first_failure is None else min(deadline, first_failure + FAILURE_GRACE_S)
            wait_s = limit - time.monotonic()
            if wait_s <= 0:
                break
            objs = [workers[i].conn for i in pending] + [workers[i].proc.sentinel for i in pending]
            ready = mpc.wait(objs, timeout=wait_s)
            for obj in ready:
                w = by_obj[obj]
                i = index[id(w)]
                if i not in pending:
                    continue
                msg = None
                try:
                    if w.conn.poll():
                        msg = pickle.loads(w.conn.recv_bytes())
                except (EOFError, OSError):
                    msg = None
                if msg is None:
                    if obj is w.conn and _exit_code(w.proc, 0.0) is None:
                        continue  # spurious wake-up
                    code = _exit_code(w.proc, 1.0)  # not reaped: kill() still reaches its group
                    who = f"rank {w.ranks[0]}" if len(w.ranks) == 1 else \
                        f"the threaded host of ranks {w.ranks[0]}..{w.ranks[-1]}"
                    text = (f"{who} {_describe_exit(code)} "
                            f"(no Python exception: the process ended abruptly, e.g. os._exit or a crash)\n")
                    dumped = _read_from(w.dump_path, w.dump_offset)
                    if dumped.strip():
                        text += "faulthandler output:\n" + dumped
                    for r in w.ranks:
                        deaths[r] = text
                    pending.discard(i)
                    first_failure = first_failure or time.monotonic()
                    continue
                tag, items = msg
                if startup and tag == "ready":
                    pending.discard(i)
                    continue
                if startup and tag in ("fail", "startup_timeout"):
                    for r, kind, payload, exc in items:
                        replies[r] = (kind, payload, exc)
                    pending.discard(i)
                    first_failure = first_failure or time.monotonic()
                    continue
                if tag != seq:
                    continue  # a late answer to an earlier, abandoned step
                for r, kind, payload, exc in items:
                    replies[r] = (kind, payload, exc)
                    if kind != "ok":
                        first_failure = first_failure or time.monotonic()
                pending.discard(i)

        what = "start-up" if startup else "step"
        stuck_workers = [workers[i] for i in sorted(pending)]
        errors = {r: v for r, v in replies.items() if v[0] == "err"}
        timeouts = {r: v[1] for r, v in replies.items() if v[0] == "timeout"}
        broken = bool(deaths or stuck_workers or timeouts or any(v[0] == "stopped" for v in replies.values()))
        if deaths or errors:
            failures = {r: t for r, t in deaths.items()}
            for r, (_, tb, _) in errors.items():
                failures.setdefault(r, tb)
            lead = min(deaths) if deaths else min(errors)
            text = failures[lead]
            others = sorted(set(failures) - {lead})
            stuck = sorted(r for w in stuck_workers for r in w.ranks) + sorted(timeouts)
            stuck += sorted(r for r, v in replies.items() if v[0] == "stopped")
            if others:
                text += f"\n(also failed: ranks {others})"
            if stuck:
                text += f"\n(ranks {stuck} had not finished and were stopped)"
            err = RankFailure(lead, text, failures)
            cause = None
            if lead in errors and errors[lead][2] is not None:
                try:
                    cause = pickle.loads(errors[lead][2])
                except Exception:  # noqa: BLE001
                    cause = None
            if broken:
                self._world.kill()
            if startup:
                self._world.kill()
            raise err from cause
        if stuck_workers or timeouts:
            stacks = dict(timeouts)
            stacks.update(self._dump_stacks(stuck_workers))
            self._world.kill()
            ranks = sorted(stacks)
            body = "\n".join(f"--- rank {r} ---\n{stacks[r]}" for r in ranks)
            state = "did not come up" if startup else "stuck"
            raise WorldTimeout(
                f"{what} did not finish within timeout_s={timeout:g} on backend {self.backend!r}: "
                f"ranks {ranks} {state} (world torn down; the next run starts a fresh one)\n{body}",
                ranks=ranks, stacks=stacks, timeout_s=timeout,
            )
        if broken:  # pragma: no cover - defensive: "stopped" without an error
            self._world.kill()
        return replies

    def _dump_stacks(self, workers: list[_Worker]) -> dict[int, str]:
        """SIGUSR1 each stuck process (faulthandler writes its stacks) and read the dumps."""
        offsets = {}
        for w in workers:
            w.dump_offset = _file_size(w.dump_path)
            offsets[id(w)] = w.dump_offset
            try:
                os.kill(w.proc.pid, signal.SIGUSR1)
            except OSError:
                pass
        deadline = time.monotonic() + STACK_DUMP_WAIT_S
        last = {id(w): -1 for w in workers}
        while time.monotonic() < deadline:
            sizes = {id(w): _file_size(w.dump_path) for w in workers}
            if all(sizes[k] > offsets[k] and sizes[k] == last[k] for k in sizes):
                break
            last = sizes
            time.sleep(0.05)
        stacks = {}
        for w in workers:
            text = _read_from(w.dump_path, offsets[id(w)]) or "(no stack dump arrived)\n"
            for r in w.ranks:
                stacks[r] = text
        return stacks


def _check_module_names(field: str, names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of dotted module names (a list or tuple of strings; a bare string is refused)."""
    names = check_type(field, names, (list, tuple), "must be a list or tuple of module names, e.g. ('torch._dynamo',)")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"{field}[{i}]", name, "must be a module name such as 'torch._dynamo'")
    return tuple(names)


def _check_env(field: str, env: Any) -> dict[str, str]:
    """``env`` (None or a mapping of names to values, all strings) as a new dict."""
    if env is None:
        return {}
    env = check_type(field, env, Mapping, "must be a dict of environment variable names to string values")
    checked = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ConfigError(field, key, "has a key that is not an environment variable name "
                                          "(a non-empty string without '=' or NUL)")
        if not isinstance(value, str) or "\0" in value:
            raise ConfigError(f"{field}[{key!r}]", value, "must be a string without NUL")
        checked[key] = value
    return checked


def check_timeout(field: str, value: object) -> float:
    """``value`` as float seconds: a real number (bools rejected), finite, ``> 0`` and
    ``<= MAX_TIMEOUT_S`` (one day). Raises ConfigError naming ``field`` otherwise."""
    return check_float(field, value, gt=0.0, max_value=MAX_TIMEOUT_S, why="seconds: one day at most")
