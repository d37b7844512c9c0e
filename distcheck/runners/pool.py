"""A persistent pool of ranks that runs rank functions on a real torch.distributed world.

    from distcheck.runners import RankPool
    with RankPool(world_size=4, backend="gloo", timeout_s=60) as pool:
        results = pool.run(fn, *args)          # fn(ctx, *args) on every rank
        # results == [result of rank 0, result of rank 1, ...]

This module is the pool's lifecycle, seen from the parent: start a world, send it
steps, collect the answers within a deadline, report failures, tear it down. The
rest of the machinery lives beside it (details in docs/RUNNERS.md):

* :mod:`~distcheck.runners.backends`: which backends run here, size and timeout limits;
* :mod:`~distcheck.runners.child`: what runs inside a rank (set-up, the task loop, the
  guard that takes every descendant along), with the messages of
  :mod:`~distcheck.runners.protocol`; the threaded backend's host is
  :mod:`~distcheck.runners.threaded_host`;
* :mod:`~distcheck.runners.workers`: the parent's handles on its children (kill by
  process group, exit codes, their answers to a step, stack dumps);
* :mod:`~distcheck.runners.folders` and :mod:`~distcheck.runners.procfs`: the pool's
  temporary folder, its owner marker, and the sweep of dead owners' folders.

Backends:

* ``gloo``: one forked process per rank (forked worlds start in tens of
  milliseconds; spawned ones take seconds). Ranks join the world through a
  ``FileStore`` in the pool's private temporary folder: no port is fixed, so
  pools are safe under pytest-xdist.
* ``nccl``: one *spawned* process per GPU (CUDA cannot be used in a forked
  child), rank ``r`` on ``cuda:r``. Without enough GPUs, :class:`RankPool`
  raises :class:`~distcheck.core.errors.BackendUnavailable` in the constructor,
  before anything is started.
* ``threaded``: torch's in-memory threaded process group: one forked host
  process runs every rank as a thread (see :mod:`distcheck.runners.threaded`).

The world persists across :meth:`RankPool.run` calls. A run that fails (a rank
raised while others were stuck, a rank died, or the step timed out) tears the
world down; the next run starts a fresh one. Failure reporting:

* a rank raises -> :class:`~distcheck.core.errors.RankFailure` (rank, traceback text);
  the original exception is chained as ``__cause__`` when it can be unpickled;
  ``failure.failures`` maps every failed rank to its traceback text.
* a rank dies (segfault, ``os._exit``) -> ``RankFailure`` for that rank, with its
  exit code or signal and whatever ``faulthandler`` wrote on the way down.
* a step does not finish in ``timeout_s`` -> :class:`~distcheck.core.errors.WorldTimeout`
  carrying the Python stacks of the stuck ranks (``.stacks``: rank -> text,
  ``.ranks``), dumped by ``faulthandler`` on ``SIGUSR1``; it is raised at most a
  few seconds after the timeout.

The pool installs no signal handler. This module imports torch only when a world is started.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from distcheck.core.errors import BackendUnavailable, ConfigError, DistributedError, RankFailure, WorldTimeout
from distcheck.core.validate import check_callable, check_choice, check_positive_int, check_type
from distcheck.runners.backends import (
    BACKENDS,
    MAX_LOCAL_RANKS,
    check_backend_available,
    check_timeout,
)
from distcheck.runners.child import child_main
from distcheck.runners.folders import make_pool_folder
from distcheck.runners.folders import owner_line as _owner_line  # noqa: F401 - the marker format, kept importable here
from distcheck.runners.workers import (
    Replies,
    Worker,
    World,
    cleanup,
    dump_stacks,
)

__all__ = [ "RankPool"]

#: a threaded host answers by itself at the timeout; the parent's hard limit is this much later
THREADED_HARD_MARGIN_S = 5.0
#: at start-up the threaded host reports its ranks that did not come up at the deadline;
#: the parent waits this much longer for that report before dumping the host's stacks itself
THREADED_STARTUP_MARGIN_S = 1.0


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
                              "(up to 1024 ranks) or distcheck.engine.fake for larger worlds")
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
        self._world = World()
        self._closed = False
        self._seq = 0
        self._lock = threading.RLock()
        self._finalizer = weakref.finalize(self, cleanup, self._world)

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
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

    def start(self) -> Self:
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

    def run(self, fn: Callable, *args: Any, timeout_s: float | None = None) -> list:
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
                except Exception as exc:  # noqa: BLE001 - whatever pickle raises
                    raise ConfigError("fn", getattr(fn, "__qualname__", fn),
                                      f"and its arguments must be picklable (a module-level function): {exc}") from None
            try:
                for w, msg in zip(self._world.workers, messages, strict=True):
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
        import torch
        import torch.distributed  # noqa: F401 - loaded once here so forked children inherit it

        if self.start_method == "fork":
            for i, name in enumerate(self.preload):
                try:
                    importlib.import_module(name)
                except ModuleNotFoundError as exc:
                    if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                        raise ConfigError(f"preload[{i}]", name, "must name an importable module") from None
                    raise
        if self._world.tmpdir is None:
            self._world.tmpdir = make_pool_folder()
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
                proc = ctx.Process(target=child_main, args=(child_conn, spec),
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
                self._world.workers.append(Worker(proc, parent_conn, ranks, dump_path))
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

    def _collect(self, seq: object, timeout: float, startup: bool = False,
                 deadline: float | None = None) -> dict[int, tuple]:
        """Wait for every worker's reply to ``seq``; return rank -> (kind, payload, exc).

        ``deadline`` (``time.monotonic()`` seconds) defaults to now plus the step's hard limit.
        Raises RankFailure (a rank raised or died) or WorldTimeout (stuck ranks), tearing a broken
        world down first.
        """
        if deadline is None:
            deadline = time.monotonic() + self._hard_limit(timeout)
        got = Replies(self._world.workers, seq, startup)
        got.wait(deadline)
        stuck_workers = [got.workers[i] for i in sorted(got.pending)]
        errors = {r: v for r, v in got.replies.items() if v[0] == "err"}
        timeouts = {r: v[1] for r, v in got.replies.items() if v[0] == "timeout"}
        stopped = sorted(r for r, v in got.replies.items() if v[0] == "stopped")
        broken = bool(got.deaths or stuck_workers or timeouts or stopped)
        if got.deaths or errors:
            stuck = sorted(r for w in stuck_workers for r in w.ranks) + sorted(timeouts) + stopped
            self._raise_rank_failure(got.deaths, errors, stuck, kill=broken or startup)
        if stuck_workers or timeouts:
            self._raise_timeout(stuck_workers, timeouts, timeout, startup)
        if broken:  # pragma: no cover - defensive: "stopped" without an error
            self._world.kill()
        return got.replies

    def _raise_rank_failure(self, deaths: dict[int, str], errors: dict[int, tuple], stuck: list[int],
                            kill: bool) -> None:
        """Raise RankFailure for the lowest rank that died, else the first that raised (its exception chained)."""
        failures = dict(deaths)
        for r, (_, tb, _) in errors.items():
            failures.setdefault(r, tb)
        lead = min(deaths) if deaths else min(errors)
        text = failures[lead]
        others = sorted(set(failures) - {lead})
        if others:
            text += f"\n(also failed: ranks {others})"
        if stuck:
            text += f"\n(ranks {stuck} had not finished and were stopped)"
        err = RankFailure(lead, text, failures)
        cause = None
        if lead in errors and errors[lead][2] is not None:
            try:
                cause = pickle.loads(errors[lead][2])
            except Exception:  # noqa: BLE001 - cannot be unpickled here: the text says it all
                cause = None
        if kill:
            self._world.kill()
        raise err from cause

    def _raise_timeout(self, stuck_workers: list[Worker], timeouts: dict[int, str], timeout: float,
                       startup: bool) -> None:
        """Raise WorldTimeout with the stacks of the stuck ranks, after tearing the world down."""
        stacks = dict(timeouts)
        stacks.update(dump_stacks(stuck_workers))
        self._world.kill()
        ranks = sorted(stacks)
        body = "\n".join(f"--- rank {r} ---\n{stacks[r]}" for r in ranks)
        what, state = ("start-up", "did not come up") if startup else ("step", "stuck")
        raise WorldTimeout(
            f"{what} did not finish within timeout_s={timeout:g} on backend {self.backend!r}: "
            f"ranks {ranks} {state} (world torn down; the next run starts a fresh one)\n{body}",
            ranks=ranks, stacks=stacks, timeout_s=timeout,
        )


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
