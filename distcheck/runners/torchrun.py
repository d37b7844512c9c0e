"""``distcheck check`` under ``torchrun``: the launcher's entry points, at their public path.

From the command line, the whole suite (rank 0 prints the table; every rank exits
with the same code)::

    torchrun --standalone --nproc-per-node=2 -m distcheck check --launcher torchrun
    torchrun --standalone --nproc-per-node=2 -m distcheck.runners.torchrun   # world stages only

:func:`run_check_under_torchrun` is what ``distcheck check --launcher torchrun``
runs; the orchestration itself (which stage runs on which rank, when, and the
exit code every rank returns) is :func:`distcheck.stages.run_torchrun`, shared with
the local launcher. The world is :class:`~distcheck.runners.torchrun_world.TorchrunWorld`
(re-exported here, with :func:`launched_by_torchrun`).

This module is an entry point, at the level of the command line: it calls
:mod:`distcheck.stages`, which the rest of ``distcheck.runners`` never imports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [ "main", "run_check_under_torchrun"]


def run_check_under_torchrun(args: Any, environ: Mapping[str, str] | None = None) -> int:
    """``distcheck check --launcher torchrun``: this process is one rank of a torchrun launch.

    ``args`` is the parsed ``check`` namespace: ``backend`` (``"gloo"`` or
    ``"nccl"``; ``"none"`` runs no world stage; ``"threaded"`` is refused),
    ``timeout`` (seconds, the process group's collective timeout), ``format``
    (``"table"`` or ``"json"``), ``only``/``skip`` (stages), and optionally
    ``profile``, ``seed`` and ``golden_dir``. ``world_sizes`` is ignored: the world is
    what torchrun launched. ``environ`` replaces ``os.environ`` (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``).

    Every rank runs the world stages through one :class:`TorchrunWorld` (the DDP
    rows, then every layer's world checks). Rank 0 alone runs the world-free checks
    (before joining: the fake backend needs a process without a process group) and
    the pure stages (after the world stages), and prints the report. The exit code
    (0 pass, 1 a FAIL row) is rank 0's, broadcast so that every rank returns the
    same one; if the broadcast itself fails every rank returns 1.

    Raises:
        ConfigError: not launched by torchrun (``RANK`` etc. missing), or
            ``backend="threaded"``.
    """
    from distcheck.stages import run_torchrun

    return run_torchrun(args, environ)


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun ... -m distcheck.runners.torchrun``: the stages that need a world; rank 0 prints.

    The same as ``python -m distcheck check --launcher torchrun`` skipping every pure stage
    (``--skip properties --skip golden``).
    """
    import argparse

    from distcheck.runners.backends import timeout_seconds
    from distcheck.stages import stage_names

    parser = argparse.ArgumentParser(prog="distcheck.runners.torchrun")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default: nccl when CUDA is visible, else gloo")
    parser.add_argument("--timeout", type=timeout_seconds, default=600.0,
                        help="process group timeout, seconds (default 600, at most 86400)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--only", action="append", choices=stage_names(needs_world=True), default=None)
    ns = parser.parse_args(argv)
    if ns.backend is None:
        import torch

        ns.backend = "nccl" if torch.cuda.is_available() else "gloo"
    ns.skip = list(stage_names(needs_world=False))
    return run_check_under_torchrun(ns)


if __name__ == "__main__":
    raise SystemExit(main())
