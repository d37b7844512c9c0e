"""All real-layer checks on one backend: the ``layers`` stage of ``distcheck check``.

One :class:`~distcheck.runners.pool.RankPool` is started per world size and
reused by every layer's checks (collectives, ZeRO-1, FSDP2, DTensor tensor
parallel, pipelining, DeviceMesh); world-free checks (torch's pipeline tables,
a 16,384-rank DeviceMesh on the fake backend) run once. Known upstream
discrepancies are labelled ``finding`` by :mod:`distcheck.runners.findings`.
"""

from __future__ import annotations

from collections.abc import Sequence

from distcheck.errors import BackendUnavailable
from distcheck.report import CheckResult

__all__ = ["LAYERS", "layer_rows", "run_layer_checks", "unavailable_layer_rows", "world_free_layer_rows"]

#: layer name -> (module, driver function); each driver takes a world first
LAYERS = {
    "collectives": ("distcheck.runners.collectives", "run_collective_checks"),
    "zero1": ("distcheck.runners.zero1", "run_zero1_checks"),
    "fsdp2": ("distcheck.runners.fsdp", "run_fsdp_checks"),
    "tensor_parallel": ("distcheck.runners.tensor_parallel", "run_tp_checks"),
    "mesh": ("distcheck.runners.mesh", "run_mesh_checks"),
}


def _drivers(layers: Sequence[str] | None) -> dict:
    """Layer name -> driver for ``layers`` (default all); ConfigError for an unknown name."""
    import importlib

    from distcheck.errors import ConfigError

    names = list(LAYERS if layers is None else layers)
    for name in names:
        if name not in LAYERS:
            raise ConfigError("layers", name, f"must be one of {', '.join(LAYERS)}")
    return {n: getattr(importlib.import_module(LAYERS[n][0]), LAYERS[n][1]) for n in names}


def _kwargs(name: str) -> dict:
    return {"tables": False} if name == "pipelining" else {}  # the tables are world-free: run once


def world_free_layer_rows(layers: Sequence[str] | None = None) -> list[CheckResult]:
    """The checks that need no world: torch's pipeline tables, a 16,384-rank DeviceMesh on the fake backend.

    Must run in a process without a default process group (the fake backend
    installs its own), so under torchrun call it before the world is joined.
    Known upstream discrepancies are labelled ``finding``.
    """
    from distcheck.runners.findings import label_findings

    names = _drivers(layers)
    rows: list[CheckResult] = []
    if "mesh" in names:
        from distcheck.runners.mesh import run_fake_mesh_check

        rows += run_fake_mesh_check()
    return label_findings(rows)


def layer_rows(world, layers: Sequence[str] | None = None, timeout_s: float = 120.0) -> list[CheckResult]:
    """Every layer's world checks on one existing world; return the rows.

    Args:
        world: a started or unstarted :class:`~distcheck.runners.pool.RankPool`, a
            :class:`~distcheck.runners.torchrun.TorchrunWorld`, or any object with
            ``.run(fn, *args)``, ``.world_size`` and ``.backend``.
        layers: a subset of :data:`LAYERS` (default: all).
        timeout_s: passed to the drivers (a pool uses its own timeout per step).

    The world-free checks are not included (:func:`world_free_layer_rows`).
    Raises ConfigError for an unknown layer name.
    """
    from distcheck.runners.findings import label_findings

    rows: list[CheckResult] = []
    for name, drive in _drivers(layers).items():
        rows += drive(world, backend=world.backend, timeout_s=timeout_s, **_kwargs(name))
    return label_findings(rows)


def unavailable_layer_rows(world_size: int, backend: str = "gloo", timeout_s: float = 120.0,
                           layers: Sequence[str] | None = None) -> list[CheckResult]:
    """The ``skip`` rows every layer gives for a world of ``world_size`` ranks that ``backend`` cannot run here.

    Call it only once :func:`~distcheck.runners.backends.check_backend_available` refused
    the world (each driver decides its own skip rows, and would start a pool otherwise).
    Raises ConfigError for an unknown layer name.
    """
    rows: list[CheckResult] = []
    for n, drive in _drivers(layers).items():
        rows += drive([world_size], backend=backend, timeout_s=timeout_s, **_kwargs(n))
    return rows


def run_layer_checks(world_sizes: Sequence[int] = (2, 4), backend: str = "gloo", timeout_s: float = 120.0,
                     layers: Sequence[str] | None = None) -> list[CheckResult]:
    """Run every layer's checks on ``backend`` at each world size; return the rows.

    Args:
        world_sizes: ranks per world; one pool is started per size and reused.
        backend: ``"gloo"`` (CPU processes), ``"threaded"`` or ``"nccl"`` (one GPU per rank).
            An unavailable backend gives ``skip`` rows, decided before anything starts.
        timeout_s: timeout of each multi-process step, in seconds.
        layers: a subset of :data:`LAYERS` (default: all).

    Raises:
        ConfigError: an unknown layer name or a bad world size.
    """
    from distcheck.errors import check_positive_int
    from distcheck.runners.findings import label_findings
    from distcheck.runners.pool import RankPool, check_backend_available

    drivers = _drivers(layers)
    rows: list[CheckResult] = world_free_layer_rows(list(drivers))
    for ws in world_sizes:
        check_positive_int("world_size", ws)
        try:
            check_backend_available(backend, ws)
        except BackendUnavailable:
            rows += unavailable_layer_rows(ws, backend, timeout_s, list(drivers))
            continue
        with RankPool(world_size=ws, backend=backend, timeout_s=timeout_s) as pool:
            rows += layer_rows(pool, list(drivers), timeout_s)
    return label_findings(rows)
