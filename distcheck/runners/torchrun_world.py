"""Run the same rank functions in a process launched by ``torchrun`` (one node or many).

torchrun starts one process per rank and tells each who it is through the
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``). :class:`TorchrunWorld` joins that world (``env://``
rendezvous) and offers the pool's ``run`` and ``run_on`` contract::

    world = TorchrunWorld()            # nccl when CUDA is visible, else gloo
    results = world.run(fn, *args)     # fn(ctx, *args) here; every rank gets [rank 0, rank 1, ...]

Results (and failures) are exchanged with ``all_gather_object``: a rank that
raises sends its traceback instead of a result, and *every* rank then raises the
same :class:`~distcheck.core.errors.RankFailure`, so no rank is left waiting. There
is no parent to kill a stuck rank: a hang ends at the process group's timeout
(``timeout_s``) or at torchrun's own watchdog.

``distcheck check --launcher torchrun`` runs its stages through this world
(:mod:`distcheck.stages`; the entry point ``python -m distcheck.runners.torchrun``
is :mod:`distcheck.runners.torchrun`).
"""

from __future__ import annotations

import datetime
import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from distcheck.core.errors import BackendUnavailable, ConfigError, DistributedError, RankFailure
from distcheck.core.validate import check_callable, check_choice, check_type
from distcheck.runners.backends import check_timeout

if TYPE_CHECKING:
    from distcheck.engine.world import RankContext

__all__ = ["FINAL_EXCHANGE_TIMEOUT_S", "RESOLVE_TIMEOUT_S", "TorchrunWorld", "check_master", "launched_by_torchrun"]

#: how long (seconds) ranks other than 0 wait in :meth:`TorchrunWorld.rank0_broadcaster`'s exchange
#: (``distcheck check``: rank 0's pure stages and its exit code); if rank 0 dies first, torchrun
#: stops the others
FINAL_EXCHANGE_TIMEOUT_S = 3600.0

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are all set."""
    env = os.environ if environ is None else environ
    return all(k in env for k in _ENV)


def _env_int(env: Mapping[str, str], name: str) -> int:
    """``env[name]`` as an int >= 0: a string of decimal digits, as torchrun sets it."""
    raw = env.get(name)
    if raw is None:
        raise ConfigError(name, None, "must be set in the environment (launch with torchrun)")
    if not isinstance(raw, str):
        raise ConfigError(name, raw, "must be a string of decimal digits (an environment value)")
    text = raw.strip()
    if len(text) > _MAX_ENV_DIGITS:  # never read: Python refuses integers of more than 4300 digits
        raise ConfigError(name, f"<{len(text):,} characters>",
                          f"must be an integer >= 0 of at most {_MAX_ENV_DIGITS} decimal digits")
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        raise ConfigError(name, int(text), "must be >= 0")
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(name, raw, "must be an integer >= 0 written in decimal digits")
    return int(text)


#: the most digits a rank, world size or port read from the environment may have (2**63 has 19)
_MAX_ENV_DIGITS = 18
#: seconds :func:`check_master` waits for ``MASTER_ADDR`` to resolve (torch's own store retries for far longer)
RESOLVE_TIMEOUT_S = 5.0


def check_master(env: Mapping[str, str], *, required: bool, resolve_timeout_s: float = RESOLVE_TIMEOUT_S) -> None:
    """Check the rendezvous address of an ``env://`` launch: ``MASTER_PORT`` an integer from 1 to 65535,
    ``MASTER_ADDR`` a host name or address that resolves within ``resolve_timeout_s`` seconds.

    With ``required`` a missing variable is refused too (the process group is about to be created
    from them); without, only those present are checked. Raises ConfigError naming the variable."""
    import socket
    import threading

    port_text = env.get("MASTER_PORT")
    if port_text is None:
        if required:
            raise ConfigError("MASTER_PORT", None, "must be set in the environment (launch with torchrun)")
    else:
        port = _env_int(env, "MASTER_PORT")
        if not 1 <= port <= 65535:
            raise ConfigError("MASTER_PORT", port, "must be a TCP port from 1 to 65535")
    host = env.get("MASTER_ADDR")
    if host is None:
        if required:
            raise ConfigError("MASTER_ADDR", None, "must be set in the environment (launch with torchrun)")
        return
    if not isinstance(host, str) or not host.strip() or len(host) > 253:
        raise ConfigError("MASTER_ADDR", host if isinstance(host, str) and len(host) <= 253 else "<long text>",
                          "must be a host name or an IP address")
    outcome: dict[str, Any] = {}

    def resolve() -> None:
        try:
            socket.getaddrinfo(host.strip(), None)
            outcome["ok"] = True
        except (OSError, UnicodeError) as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=resolve, name="distcheck-resolve-master", daemon=True)
    thread.start()
    thread.join(resolve_timeout_s)
    if "error" in outcome:
        raise ConfigError("MASTER_ADDR", host, f"does not resolve ({outcome['error']})")
    if "ok" not in outcome:
        raise ConfigError("MASTER_ADDR", host, f"did not resolve within {resolve_timeout_s:g} s")


class TorchrunWorld:
    """This process's rank of a torchrun-launched world.

    Arguments:
        backend: ``"gloo"`` or ``"nccl"``; default nccl when CUDA is available, else gloo.
        timeout_s: the process group's collective timeout, seconds, in
            ``(0, MAX_TIMEOUT_S]`` (at most one day; default 600).
        environ: the environment to read, a mapping of strings (default
            ``os.environ``; never modified).

    Raises:
        ConfigError: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` missing or not decimal
            digits (at most 18), ``RANK >= WORLD_SIZE``, ``MASTER_PORT`` not a port or
            ``MASTER_ADDR`` that does not resolve within :data:`RESOLVE_TIMEOUT_S` seconds
            (:func:`check_master`), or a bad ``backend``, ``timeout_s`` or ``environ``.
    """

    def __init__(self, backend: str | None = None, timeout_s: float = 600.0,
                 environ: Mapping[str, str] | None = None):
        env = os.environ if environ is None else check_type(
            "environ", environ, Mapping, "must be a mapping of environment variable names to strings (or None)")
        self.rank = _env_int(env, "RANK")
        self.world_size = _env_int(env, "WORLD_SIZE")
        self.local_rank = _env_int(env, "LOCAL_RANK")
        if self.world_size < 1:
            raise ConfigError("WORLD_SIZE", self.world_size, "must be >= 1")
        if self.rank >= self.world_size:
            raise ConfigError("RANK", self.rank, f"must be < WORLD_SIZE={self.world_size}")
        check_master(env, required=False)  # before any work: a bad port or host fails now, in one line
        if backend is not None:
            check_choice("backend", backend, ("gloo", "nccl"))
        self._backend = backend
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self._owns_group = False
        self._ctx: RankContext | None = None
        self._broken: str | None = None

    @property
    def backend(self) -> str:
        if self._backend is None:
            import torch

            self._backend = "nccl" if torch.cuda.is_available() else "gloo"
        return self._backend

    def start(self) -> Self:
        """Join the world (``init_process_group("env://")``) unless this process already has one.

        Raises ConfigError when an existing process group disagrees with ``RANK``/``WORLD_SIZE``,
        and BackendUnavailable for NCCL without a GPU for ``LOCAL_RANK``.
        """
        if self._ctx is not None:
            return self
        import torch
        import torch.distributed as dist

        from distcheck.engine.world import RankContext

        extra: dict[str, Any] = {}
        if self.backend == "nccl":
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if have <= self.local_rank:
                raise BackendUnavailable(f"backend 'nccl' needs a GPU for LOCAL_RANK={self.local_rank}; {have} visible")
            torch.cuda.set_device(self.local_rank)
            device = torch.device("cuda", self.local_rank)
            extra = {"device_id": device}
        else:
            device = torch.device("cpu")
        if not dist.is_initialized():
            check_master(os.environ, required=True)  # what env:// reads
            dist.init_process_group(self.backend, init_method="env://", rank=self.rank, world_size=self.world_size,
                                    timeout=datetime.timedelta(seconds=self.timeout_s), **extra)
            self._owns_group = True
        elif (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world_size):
            raise ConfigError("RANK", self.rank, f"must match the process group already initialised here "
                                                 f"(rank {dist.get_rank()} of {dist.get_world_size()})")
        self._ctx = RankContext(rank=self.rank, world_size=self.world_size, backend=self.backend,
                                device=device, local_rank=self.local_rank)
        return self

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        """Call ``fn(ctx, *args)`` here; return every rank's result (on every rank).

        ``timeout_s`` is accepted for API compatibility with RankPool (and checked
        like it) but ignored: the process group's timeout applies.

        Raises:
            ConfigError: ``fn`` is not callable or ``timeout_s`` is out of range.
            RankFailure: on every rank, when any rank raised (the lowest failed
                rank; ``.failures`` maps every failed rank to its traceback text).
            DistributedError: the exchange of results itself failed (a rank is
                stuck in a collective the others left, or the group timed out);
                the world is then marked broken and every later ``run`` raises at once.
        """
        check_callable("fn", fn)
        return self._run_here(fn, args, timeout_s)

    def run_on(self, fn: Callable[..., Any], args_per_rank: Sequence[Sequence[Any]],
               timeout_s: float | None = None) -> list[Any]:
        """Call ``fn(ctx, *args_per_rank[rank])`` on this rank; same contract as :meth:`run`.

        ``args_per_rank`` is a list or tuple of exactly ``world_size`` entries, each a
        tuple or list (every rank passes the whole list and uses its own entry).
        """
        check_callable("fn", fn)
        check_type("args_per_rank", args_per_rank, (list, tuple), "must be a list with one tuple of arguments per rank")
        if len(args_per_rank) != self.world_size:
            raise ConfigError("args_per_rank", f"<{len(args_per_rank)} entries>",
                              f"must have world_size={self.world_size} entries")
        for r, rank_args in enumerate(args_per_rank):
            check_type(f"args_per_rank[{r}]", rank_args, (list, tuple), "must be a tuple or list of arguments")
        return self._run_here(fn, tuple(args_per_rank[self.rank]), timeout_s)

    def _run_here(self, fn: Callable[..., Any], args: Sequence[Any], timeout_s: float | None) -> list[Any]:
        if timeout_s is not None:
            check_timeout("timeout_s", timeout_s)
        import torch.distributed as dist

        self.start()
        if self._broken:
            raise DistributedError(f"torchrun world (rank {self.rank}) is broken: {self._broken}")
        try:
            item = ("ok", fn(self._ctx, *args))
        except Exception:  # noqa: BLE001 - shared with the other ranks
            item = ("err", traceback.format_exc())
        gathered: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(gathered, item)
        except Exception as exc:  # a timed-out or mismatched exchange
            self._broken = f"result exchange failed after {getattr(fn, '__qualname__', fn)}: {exc}".splitlines()[0]
            mine = f"\n(this rank's own outcome: {item[1] if item[0] == 'err' else 'ok'})"
            raise DistributedError(self._broken + mine) from exc
        failures = {r: text for r, (kind, text) in enumerate(gathered) if kind == "err"}
        if failures:
            lead = min(failures)
            raise RankFailure(lead, failures[lead], failures)
        return [payload for _, payload in gathered]

    def rank0_broadcaster(self, timeout_s: float = FINAL_EXCHANGE_TIMEOUT_S) -> Callable[[Any], Any]:
        """A function that sends rank 0's object to every rank, over a gloo side group of its own timeout.

        Call it on every rank at the same point (creating the group is a collective),
        after :meth:`start`; the returned ``share(obj)`` is a collective too, and
        returns rank 0's ``obj`` on every rank. The side group's timeout (default
        :data:`FINAL_EXCHANGE_TIMEOUT_S`) lets the other ranks wait for long work
        that rank 0 does alone, beyond the world's own ``timeout_s``. ``share``
        raises whatever torch raises when the exchange fails (a timeout, a dead rank).
        """
        check_timeout("timeout_s", timeout_s)
        import torch.distributed as dist

        self.start()
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

        def share(obj: Any) -> Any:
            box = [obj]
            dist.broadcast_object_list(box, src=0, group=group)
            return box[0]

        return share

    def close(self) -> None:
        """Leave the world if this object created the process group."""
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_group = False
        self._ctx = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


