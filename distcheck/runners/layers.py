"""All real-layer checks on one backend: the ``layers`` stage of ``distcheck check``.

One :class:`~distcheck.runners.pool.RankPool` is started per world size and
reused by every layer's checks (collectives, ZeRO-1, FSDP2, DTensor tensor
parallel, pipelining, DeviceMesh); world-free checks (torch's pipeline tables,
a 16,384-rank DeviceMesh on the fake backend) run once. Known upstream
discrepancies are labelled ``finding`` by :mod:`distcheck.runners.findings`.
"""

from __future__ import annotations

from typing import Sequence

from distcheck.errors import BackendUnavailable
from distcheck.report import CheckResult

__all__ = ["LAYERS", "run_layer_checks"]

#: layer name -> (module, driver function); each driver takes a pool first
LAYERS = {
    "collectives": ("distcheck.runners.collectives", "run_collective_checks"),
    "zero1": ("distcheck.runners.zero1", "run_zero1_checks"),
    "fsdp2": ("distcheck.runners.fsdp", "run_fsdp_checks"),
    "tensor_parallel": ("distcheck.runners.tensor_parallel", "run_tp_checks"),
    "pipelining": ("distcheck.runners.pipelining", "run_pipelining_checks"),
    "mesh": ("distcheck.runners.mesh", "run_mesh_checks"),
}


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
    import importlib

    from distcheck.errors import ConfigError, check_positive_int
    from distcheck.runners.findings import label_findings
    from distcheck.runners.pool import RankPool, check_backend_available

    names = list(layers or LAYERS)
    for name in names:
        if name not in LAYERS:
            raise ConfigError("layers", name, f"must be one of {', '.join(LAYERS)}")
    drivers = {n: getattr(importlib.import_module(LAYERS[n][0]), LAYERS[n][1]) for n in names}
    rows: list[CheckResult] = []
    if "pipelining" in names:
        from distcheck.runners.pipelining import run_table_checks

        rows += run_table_checks()
    if "mesh" in names:
        from distcheck.runners.mesh import run_fake_mesh_check

        rows += run_fake_mesh_check()
    for ws in world_sizes:
        check_positive_int("world_size", ws)
        try:
            check_backend_available(backend, ws)
        except BackendUnavailable as exc:
            for n, drive in drivers.items():  # the drivers emit their own skip rows
                rows += drive([ws], backend=backend, timeout_s=timeout_s) if n != "pipelining" else \
                    drive([ws], backend=backend, timeout_s=timeout_s, tables=False)
            continue
        with RankPool(world_size=ws, backend=backend, timeout_s=timeout_s) as pool:
            for n, drive in drivers.items():
                kwargs = {"tables": False} if n == "pipelining" else {}
                rows += drive(pool, backend=backend, timeout_s=timeout_s, **kwargs)
    return label_findings(rows)
