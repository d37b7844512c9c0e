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

From the command line (rank 0 prints the DDP rows; the exit code is 1 on failure)::

    torchrun --standalone --nproc-per-node=2 -m distcheck.runners.torchrun
"""

from __future__ import annotations

import os
import traceback
from typing import Callable

from distcheck.errors import ConfigError, RankFailure, check_choice

__all__ = ["TorchrunWorld", "launched_by_torchrun", "main"]

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def launched_by_torchrun(environ=None) -> bool:
    """True when ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are all set."""
    env = os.environ if environ is None else environ
    return all(k in env for k in _ENV)


def _env_int(env, name: str) -> int:
    raw = env.get(name)
    if raw is None:
        raise ConfigError(name, None, "must be set in the environment (launch with torchrun)")
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, raw, "must be an integer") from None
    if value < 0:
        raise ConfigError(name, value, "must be >= 0")
    return value


class TorchrunWorld:
    """This process's rank of a torchrun-launched world.

    Arguments:
        backend: ``"gloo"`` or ``"nccl"``; default nccl when CUDA is available, else gloo.
        timeout_s: the process group's collective timeout, seconds (default 600).
        environ: the environment to read (default ``os.environ``; never modified).

    Raises:
        ConfigError: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` missing or invalid, or
            ``RANK >= WORLD_SIZE``.
    """

    def __init__(self, backend: str | None = None, timeout_s: float = 600.0, environ=None):
        env = os.environ if environ is None else environ
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
        self.timeout_s = float(timeout_s)
        self._owns_group = False
        self._ctx = None

    @property
    def backend(self) -> str:
        if self._backend is None:
            import torch

            self._backend = "nccl" if torch.cuda.is_available() else "gloo"
        return self._backend

    def start(self) -> "TorchrunWorld":
        """Join the world (``init_process_group("env://")``) unless this process already has one."""
        if self._ctx is not None:
            return self
        import datetime

        import torch
        import torch.distributed as dist

        from distcheck.runners.context import RankContext

        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
            device = torch.device("cuda", self.local_rank)
        else:
            device = torch.device("cpu")
        if not dist.is_initialized():
            dist.init_process_group(self.backend, init_method="env://", rank=self.rank, world_size=self.world_size,
                                    timeout=datetime.timedelta(seconds=self.timeout_s))
            self._owns_group = True
        self._ctx = RankContext(rank=self.rank, world_size=self.world_size, backend=self.backend,
                                device=device, local_rank=self.local_rank)
        return self

    def run(self, fn: Callable, *args, timeout_s: float | None = None) -> list:
        """Call ``fn(ctx, *args)`` here; return every rank's result (on every rank).

        ``timeout_s`` is accepted for API compatibility with RankPool and ignored
        (the process group's timeout applies). Raises RankFailure (the lowest failed
        rank, ``.failures`` for all) on every rank when any rank raised.
        """
        import torch.distributed as dist

        self.start()
        try:
            item = ("ok", fn(self._ctx, *args))
        except Exception:  # noqa: BLE001 - shared with the other ranks
            item = ("err", traceback.format_exc())
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, item)
        failures = {r: text for r, (kind, text) in enumerate(gathered) if kind == "err"}
        if failures:
            lead = min(failures)
            err = RankFailure(lead, failures[lead])
            err.failures = failures
            raise err
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


def main(argv=None) -> int:
    """Entry point of ``torchrun ... -m distcheck.runners.torchrun``: DDP rows, printed by rank 0."""
    import argparse

    from distcheck.report import exit_code, render_table
    from distcheck.runners.ddp import ddp_rows

    parser = argparse.ArgumentParser(prog="distcheck.runners.torchrun")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None)
    parser.add_argument("--examples", type=int, default=6, help="examples per row (default 6)")
    args = parser.parse_args(argv)
    with TorchrunWorld(backend=args.backend) as world:
        rows = ddp_rows(world, args.examples)
        if world.rank == 0:
            render_table(rows, title=f"distcheck DDP checks (torchrun, {world.backend}, world_size={world.world_size})")
    return exit_code(rows)


if __name__ == "__main__":
    raise SystemExit(main())
