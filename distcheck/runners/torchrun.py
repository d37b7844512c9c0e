"""Run the same rank functions in a process launched by ``torchrun`` (one node or many).

torchrun starts one process per rank and tells each who it is through the
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``). :class:`TorchrunWorld` joins that world (``env://``
rendezvous) and offers the pool's ``run`` contract::

    world = TorchrunWorld()            # nccl when CUDA is visible, else gloo
    results = world.run(fn, *args)     # fn(ctx, *args) here; every rank gets [rank 0, rank 1, ...]

Results (and failures) are exchanged with ``all_gather_object``: a rank that
raises sends its traceback instead of a result, and *every* rank then raises the
same :class:`~distcheck.errors.RankFailure`, so no rank is left waiting. There
is no parent to kill a stuck rank: a hang ends at the process group's timeout
(``timeout_s``) or at torchrun's own watchdog.

From the command line, the whole suite (rank 0 prints the table; every rank
exits with the same code)::

    torchrun --standalone --nproc-per-node=2 -m distcheck check --launcher torchrun
    torchrun --standalone --nproc-per-node=2 -m distcheck.runners.torchrun   # torch stages only

:func:`run_check_under_torchrun` is what ``distcheck check --launcher torchrun``
calls.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from distcheck.errors import (
    BackendUnavailable,
    ConfigError,
    DistcheckError,
    DistributedError,
    RankFailure,
    check_choice,
)
from distcheck.validate import check_callable, check_type

if TYPE_CHECKING:
    from distcheck.runners.context import RankContext

__all__ = ["TorchrunWorld", "launched_by_torchrun", "run_check_under_torchrun", "main", "FINAL_EXCHANGE_TIMEOUT_S"]

#: stages of ``distcheck check`` that need a world, and those that are pure (run on rank 0 only)
TORCH_STAGES = ("distributed", "layers")
PURE_STAGES = ("properties", "golden")
#: how long (seconds) ranks other than 0 wait for rank 0's pure stages (properties,
#: golden figures) and its exit code; if rank 0 dies first, torchrun stops the others
FINAL_EXCHANGE_TIMEOUT_S = 3600.0

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def launched_by_torchrun(environ=None) -> bool:
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
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        raise ConfigError(name, int(text), "must be >= 0")
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(name, raw, "must be an integer >= 0 written in decimal digits")
    return int(text)


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
            digits, ``RANK >= WORLD_SIZE``, or a bad ``backend``, ``timeout_s`` or ``environ``.
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
        if backend is not None:
            check_choice("backend", backend, ("gloo", "nccl"))
        self._backend = backend
        from distcheck.runners.pool import check_timeout

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

    def start(self) -> "TorchrunWorld":
        """Join the world (``init_process_group("env://")``) unless this process already has one.

        Raises ConfigError when an existing process group disagrees with ``RANK``/``WORLD_SIZE``,
        and BackendUnavailable for NCCL without a GPU for ``LOCAL_RANK``.
        """
        if self._ctx is not None:
            return self
        import torch
        import torch.distributed as dist

        from distcheck.runners.context import RankContext

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
            dist.init_process_group(self.backend, init_method="env://", rank=self.rank, world_size=self.world_size,
                                    timeout=datetime.timedelta(seconds=self.timeout_s), **extra)
            self._owns_group = True
        elif (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world_size):
            raise ConfigError("RANK", self.rank, f"must match the process group already initialised here "
                                                 f"(rank {dist.get_rank()} of {dist.get_world_size()})")
        self._ctx = RankContext(rank=self.rank, world_size=self.world_size, backend=self.backend,
                                device=device, local_rank=self.local_rank)
        return self

    def run(self, fn: Callable, *args, timeout_s: float | None = None) -> list:
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
        if timeout_s is not None:
            from distcheck.runners.pool import check_timeout

            check_timeout("timeout_s", timeout_s)
        import torch.distributed as dist

        self.start()
        if self._broken:
            raise DistributedError(f"torchrun world (rank {self.rank}) is broken: {self._broken}")
        try:
            item = ("ok", fn(self._ctx, *args))
        except Exception:  # noqa: BLE001 - shared with the other ranks
            item = ("err", traceback.format_exc())
        gathered: list = [None] * self.world_size
        try:
            dist.all_gather_object(gathered, item)
        except Exception as exc:  # noqa: BLE001 - a timed-out or mismatched exchange
            self._broken = f"result exchange failed after {getattr(fn, '__qualname__', fn)}: {exc}".splitlines()[0]
            mine = f"\n(this rank's own outcome: {item[1] if item[0] == 'err' else 'ok'})"
            raise DistributedError(self._broken + mine) from exc
        failures = {r: text for r, (kind, text) in enumerate(gathered) if kind == "err"}
        if failures:
            lead = min(failures)
            raise RankFailure(lead, failures[lead], failures)
        return [payload for _, payload in gathered]

    def close(self) -> None:
        """Leave the world if this object created the process group."""
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_group = False
        self._ctx = None

    def __enter__(self) -> "TorchrunWorld":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _stages(args) -> set[str]:
    only = getattr(args, "only", None)
    stages = set(only) if only else set(TORCH_STAGES + PURE_STAGES)
    stages -= set(getattr(args, "skip", None) or ())
    if getattr(args, "backend", "gloo") == "none":
        stages -= set(TORCH_STAGES)
    return stages


def _pure_rows(stages: set[str], args) -> list:
    """Rank 0's pure stages (no torch): properties and golden figures, as ``distcheck check`` runs them."""
    from distcheck.report import FAIL, CheckResult

    rows: list = []
    jobs = []
    if "properties" in stages:
        from distcheck.props import run_all

        jobs.append(("properties", lambda: run_all(profile=getattr(args, "profile", None) or "ci",
                                                   seed=getattr(args, "seed", None))))
    if "golden" in stages:
        from distcheck.golden import default_golden_dir, verify_all

        jobs.append(("golden figures", lambda: verify_all(getattr(args, "golden_dir", None) or default_golden_dir())))
    for name, job in jobs:
        try:
            rows += job()
        except DistcheckError as exc:
            rows.append(CheckResult(check=name, backend="-", verdict=FAIL, detail=str(exc).splitlines()[0]))
    return rows


def _print_report(rows: list, args, world: TorchrunWorld, seconds: float) -> None:
    from distcheck.report import print_report

    print_report(rows, title=f"distcheck check (torchrun, {world.backend}, world_size={world.world_size})",
                 seconds=seconds, fmt=getattr(args, "format", "table"), suffix=f" (rank 0 of {world.world_size})")


def run_check_under_torchrun(args, environ=None) -> int:
    """``distcheck check --launcher torchrun``: this process is one rank of a torchrun launch.

    ``args`` is the parsed ``check`` namespace: ``backend`` (``"gloo"`` or
    ``"nccl"``; ``"none"`` runs no torch stage; ``"threaded"`` is refused),
    ``timeout`` (seconds, the process group's collective timeout), ``format``
    (``"table"`` or ``"json"``), ``only``/``skip`` (stages), and optionally
    ``profile`` and ``golden_dir``. ``world_sizes`` is ignored: the world is
    what torchrun launched.

    Every rank runs the same rank functions through one :class:`TorchrunWorld`
    (the DDP rows, then every layer's world checks). Rank 0 alone runs the
    world-free layer checks (before joining: the fake backend needs a process
    without a process group) and the pure stages (after the torch stages), and
    prints the report. The exit code (0 pass, 1 a FAIL row) is rank 0's,
    broadcast so that every rank returns the same one; if the broadcast itself
    fails every rank returns 1.

    Raises:
        ConfigError: not launched by torchrun (``RANK`` etc. missing), or
            ``backend="threaded"``.
    """
    from distcheck.report import FAIL, CheckResult, exit_code

    backend = check_choice("backend", getattr(args, "backend", "gloo"), ("gloo", "nccl", "none", "threaded"))
    if backend == "threaded":
        raise ConfigError("backend", backend, "cannot run under torchrun (one process per rank): use gloo or nccl")
    stages = _stages(args)
    started = time.perf_counter()
    world = TorchrunWorld(backend="gloo" if backend == "none" else backend, timeout_s=args.timeout, environ=environ)
    rows: list = []
    if world.rank == 0 and "layers" in stages:
        from distcheck.runners.layers import world_free_layer_rows

        rows += world_free_layer_rows()
    code = 1
    try:
        world.start()
        import torch.distributed as dist

        # the exit code waits for rank 0's pure stages: a side group with a long timeout
        final = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=FINAL_EXCHANGE_TIMEOUT_S))
        if "distributed" in stages:
            from distcheck.runners.ddp import ddp_rows

            rows += ddp_rows(world)
        if "layers" in stages:
            from distcheck.runners.layers import layer_rows

            rows += layer_rows(world, timeout_s=args.timeout)
        if world.rank == 0:
            rows += _pure_rows(stages, args)
        box = [exit_code(rows)]
        try:
            dist.broadcast_object_list(box, src=0, group=final)
            code = int(box[0])
        except Exception as exc:  # noqa: BLE001 - every rank then reports failure
            sys.stderr.write(f"distcheck: rank {world.rank}: exit code exchange failed: {exc}\n")
            rows.append(CheckResult("torchrun.exit_code_exchange", world.backend, FAIL, world.world_size, 0,
                                    detail=str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
            code = 1
        if world.rank == 0:
            _print_report(rows, args, world, time.perf_counter() - started)
    finally:
        world.close()
    return code


def main(argv=None) -> int:
    """``torchrun ... -m distcheck.runners.torchrun``: the torch stages (DDP and layers); rank 0 prints.

    The same as ``python -m distcheck check --launcher torchrun --skip properties --skip golden``.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="distcheck.runners.torchrun")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default: nccl when CUDA is visible, else gloo")
    from distcheck.cli import timeout_seconds

    parser.add_argument("--timeout", type=timeout_seconds, default=600.0,
                        help="process group timeout, seconds (default 600, at most 86400)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--only", action="append", choices=TORCH_STAGES, default=None)
    ns = parser.parse_args(argv)
    if ns.backend is None:
        import torch

        ns.backend = "nccl" if torch.cuda.is_available() else "gloo"
    ns.skip = list(PURE_STAGES)
    return run_check_under_torchrun(ns)


if __name__ == "__main__":
    raise SystemExit(main())
