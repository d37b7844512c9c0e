"""The parent's side of one world: its children, how they are stopped, reaped and read.

A :class:`World` is what a :class:`~distcheck.runners.pool.RankPool` holds while its
ranks are up: one :class:`Worker` per child (a rank process, or the threaded host of
every rank) and the pool's temporary folder. This module kills children by process
group before reaping them (until a child is reaped, its group id cannot belong to
anyone else), reads a dead child's exit code without reaping it, gathers the children's
answers to a step (:class:`Replies`), and collects the Python stacks of stuck children from
their faulthandler files.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import os
import pickle
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from distcheck.runners.protocol import FAILURE_GRACE_S, SHUTDOWN

__all__ = [
    "CLOSE_WAIT_S",
    "Replies",
    "STACK_DUMP_WAIT_S",
    "Worker",
    "World",
    "cleanup",
    "death_rank",
    "death_text",
    "describe_exit",
    "dump_stacks",
    "exit_code",
    "read_from",
]

#: how long close() lets children exit by themselves before killing them
CLOSE_WAIT_S = 2.0
#: how long (seconds) to wait for a stuck rank's faulthandler dump after SIGUSR1
STACK_DUMP_WAIT_S = 2.0


@dataclass
class Worker:
    """One child of a world: its process, its end of the pipe, the ranks it runs, its dump file."""

    proc: Any
    conn: Any
    ranks: list[int]
    dump_path: str
    dump_offset: int = 0


@dataclass
class World:
    """The children of the current world (empty when none is up) and the pool's folder."""

    workers: list[Worker] = field(default_factory=list)
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
            except OSError:
                pass
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.proc.join(timeout=5)
            with contextlib.suppress(Exception):
                w.conn.close()
            with contextlib.suppress(Exception):  # its sentinel pipe now, not when the garbage collector runs
                w.proc.close()
        self.workers = []

    def close(self) -> None:
        """Ask children to exit, wait up to CLOSE_WAIT_S, then kill what is left.

        Children are waited for without being reaped, so that :meth:`kill` still
        reaches each one's process group (its descendants) before reaping it.
        """
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.conn.send_bytes(SHUTDOWN)
        deadline = time.monotonic() + CLOSE_WAIT_S
        sentinels = []
        for w in self.workers:
            with contextlib.suppress(Exception):  # a process object already closed
                sentinels.append(w.proc.sentinel)
        while sentinels and (left := deadline - time.monotonic()) > 0:
            for ready in mpc.wait(sentinels, timeout=left):
                sentinels.remove(ready)
        self.kill()


def cleanup(world: World) -> None:
    """Kill the world's children and remove its folder (a pool's finalizer); never raises."""
    world.kill()
    if world.tmpdir:
        shutil.rmtree(world.tmpdir, ignore_errors=True)
        world.tmpdir = None


def exit_code(proc: Any, wait_s: float) -> int | None:
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
    code: int | None = proc.exitcode
    return code


def describe_exit(code: int | None) -> str:
    """``"exited with code 3"``, ``"was killed by SIGSEGV"``, or ``"stopped answering"`` (None)."""
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


_EXIT_MARK = re.compile(r"^distcheck: threaded rank ([0-9]+) called os\._exit\((-?[0-9]+)\)$", re.MULTILINE)


def death_rank(w: Worker) -> int | None:
    """The rank that ended worker ``w``: its one rank, or for the threaded host the rank thread that
    called ``os._exit`` (the host's mark in its dump file); None when the host died another way
    (a crash, a signal) and no rank can be named."""
    if len(w.ranks) == 1:
        return w.ranks[0]
    m = _EXIT_MARK.search(read_from(w.dump_path, w.dump_offset))
    return int(m[1]) if m and int(m[1]) in w.ranks else None


def death_text(w: Worker) -> str:
    """What to report for a child that ended without answering: its exit, and what faulthandler wrote.

    For the threaded host: the rank that called ``os._exit`` (:func:`death_rank`), or plainly that the
    host died and the rank is unknown. Waits up to 1 s for the exit code, without reaping the child
    (kill() still reaches its group).
    """
    code = exit_code(w.proc, 1.0)
    dumped = _EXIT_MARK.sub("", read_from(w.dump_path, w.dump_offset))
    if len(w.ranks) == 1:
        who = f"rank {w.ranks[0]} {describe_exit(code)}"
    elif (rank := death_rank(w)) is not None:
        who = (f"rank {rank} (a thread of the threaded host of ranks {w.ranks[0]}..{w.ranks[-1]}) called os._exit: "
               f"the host {describe_exit(code)}")
    else:
        who = (f"the threaded host of ranks {w.ranks[0]}..{w.ranks[-1]} {describe_exit(code)}; "
               "which rank ended it is unknown")
    text = f"{who} (no Python exception: the process ended abruptly, e.g. os._exit or a crash)\n"
    if dumped.strip():
        text += "faulthandler output:\n" + dumped
    return text


def read_from(path: str, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` on; ``""`` where unreadable."""
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


def dump_stacks(workers: list[Worker]) -> dict[int, str]:
    """SIGUSR1 each stuck child (faulthandler writes its stacks); return rank -> stack text.

    Waits at most :data:`STACK_DUMP_WAIT_S` for the dumps to stop growing. Each
    worker's ``dump_offset`` is moved to the start of this dump, so a later death
    report shows only what came after.
    """
    offsets = {}
    for w in workers:
        w.dump_offset = _file_size(w.dump_path)
        offsets[id(w)] = w.dump_offset
        with contextlib.suppress(OSError):
            os.kill(w.proc.pid, signal.SIGUSR1)
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
        text = read_from(w.dump_path, offsets[id(w)]) or "(no stack dump arrived)\n"
        for r in w.ranks:
            stacks[r] = text
    return stacks


class Replies:
    """The answers of a world's workers to one step ``seq`` (or to start-up), gathered as they arrive.

    ``replies``: rank -> (kind, payload, exc); ``deaths``: rank -> text of a child that ended without
    answering; ``pending``: indices of the workers not heard from.
    """

    def __init__(self, workers: list[Worker], seq: object, startup: bool):
        self.workers, self.seq, self.startup = workers, seq, startup
        self.pending = set(range(len(workers)))
        self.replies: dict[int, tuple] = {}
        self.deaths: dict[int, str] = {}
        self.first_failure: float | None = None

    def wait(self, deadline: float) -> None:
        """Take answers until every worker is heard from, ``deadline`` passes, or the grace after a failure ends."""
        index: dict[Any, int] = {}
        for i, w in enumerate(self.workers):
            index[w.conn] = i
            index[w.proc.sentinel] = i
        while self.pending:
            limit = deadline if self.first_failure is None else min(deadline, self.first_failure + FAILURE_GRACE_S)
            wait_s = limit - time.monotonic()
            if wait_s <= 0:
                return
            objs = [self.workers[i].conn for i in self.pending] + [self.workers[i].proc.sentinel for i in self.pending]
            for obj in mpc.wait(objs, timeout=wait_s):
                i = index[obj]
                if i in self.pending:
                    self._take(i, obj)

    def _failed(self) -> None:
        self.first_failure = self.first_failure or time.monotonic()

    def _take(self, i: int, obj: object) -> None:
        """Handle worker ``i`` becoming ready through ``obj`` (its pipe or its process sentinel)."""
        w = self.workers[i]
        msg = None
        try:
            if w.conn.poll():
                msg = pickle.loads(w.conn.recv_bytes())
        except (EOFError, OSError):
            msg = None
        if msg is None:
            if obj is w.conn and exit_code(w.proc, 0.0) is None:
                return  # spurious wake-up
            text, named = death_text(w), death_rank(w)
            for r in w.ranks:
                if named is None or r == named:
                    self.deaths[r] = text
                else:  # the other threads of a threaded host that one rank ended
                    self.replies[r] = ("stopped", f"stopped: rank {named} ended the threaded host", None)
            self.pending.discard(i)
            self._failed()
            return
        tag, items = msg
        if tag == "warned":  # the ranks' warnings, ahead of their answer: kept for the report's summary
            from distcheck.runners.warned import record

            record(items)
            return
        if self.startup and tag == "ready":
            self.pending.discard(i)
        elif self.startup and tag in ("fail", "startup_timeout"):
            self._record(items)
            self.pending.discard(i)
            self._failed()
        elif tag == self.seq:  # else a late answer to an earlier, abandoned step
            if self._record(items):
                self._failed()
            self.pending.discard(i)

    def _record(self, items: list[tuple]) -> bool:
        """Store ``(rank, kind, payload, exc)`` items; True if any is not ``"ok"``."""
        for r, kind, payload, exc in items:
            self.replies[r] = (kind, payload, exc)
        return any(kind != "ok" for _, kind, _, _ in items)
