"""``init_device_mesh`` rank groups against :func:`distcheck.parallel.layout.groups`: the ``mesh.groups``
rows of ``distcheck check``'s layers stage (torch imported inside the functions only).

Rank function :func:`mesh_groups_rank`: build
``init_device_mesh(device, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))``
(outermost first, so tp is innermost: consecutive ranks) and return, for each
axis, the ranks of this rank's process group (``dist.get_process_group_ranks``
of ``mesh.get_group(axis)``), plus the mesh's rank grid.

``mesh.groups`` (gloo / threaded / NCCL): the union over all ranks of the
groups torch created equals ``layout.groups(cfg, axis)`` for every axis, with
``cfg = ParallelConfig(tp, pp, dp, order="tp-dp-pp")`` (innermost first, the
same layout stated independently), and every rank's mesh grid equals
``layout.rank_grid(cfg)``.

``mesh.groups.fake`` (one process, torch's fake backend over a ``FakeStore``,
no real ranks): the same for a 16,384-rank world (Llama 3 405B: tp 8, pp 16,
dp 128; Dubey et al. 2024, Table 4). One process impersonates a handful of
ranks (first, last, and ranks spread across every axis); each rank's group on
each axis must be the layout group that contains it, and the grid must match.

Meshes are enumerated, not drawn: at a world of n ranks every factorisation
pp * dp * tp = n is run (3 at n = 2, 6 at n = 4, 10 at n = 8), which is every
case a Hypothesis draw could reach; the row says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from distcheck.core.results import CheckResult
from distcheck.core.validate import check_positive_int
from distcheck.core.vocab import Axis
from distcheck.engine.drivers import result_row, run_guarded, skip_row
from distcheck.engine.world import RankContext, World

if TYPE_CHECKING:
    from distcheck.parallel.layout.reference import ParallelConfig

__all__ = ["MESH_AXES", "mesh_groups_rank", "mesh_rows", "fake_mesh_rows", "sample_ranks", "world_rows",
           "world_free_rows", "skip_rows"]

#: the real-backend checks of this package join the layers stage of ``distcheck check``
STAGE = "layers"

#: mesh axes, outermost first
MESH_AXES = (Axis.PP, Axis.DP, Axis.TP)


def mesh_groups_rank(ctx: RankContext, example: dict) -> dict:
    """Rank function: this rank's group on each axis of a ``(pp, dp, tp)`` mesh.

    ``example``: ``{"pp": int, "dp": int, "tp": int}`` with product = world size.
    Returns ``{"groups": {axis: [ranks...]}, "grid": nested list (pp, dp, tp)}``.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    shape = tuple(check_positive_int(a, example[a]) for a in MESH_AXES)
    mesh = init_device_mesh(ctx.device.type, shape, mesh_dim_names=MESH_AXES)
    groups = {a: sorted(dist.get_process_group_ranks(mesh.get_group(a))) for a in MESH_AXES}
    return {"groups": groups, "grid": mesh.mesh.tolist()}


def _layout(example: dict, order: str) -> ParallelConfig:
    from distcheck.parallel.layout.reference import ParallelConfig

    return ParallelConfig(tp=example["tp"], pp=example["pp"], dp=example["dp"], order=order)


def _compare(results_by_rank: dict[int, dict], example: dict, order: str, full_world: bool) -> list[str]:
    """Differences between torch's groups (of the ranks given) and the layout reference."""
    import numpy as np

    from distcheck.parallel.layout import reference as layout

    cfg = _layout(example, order)
    bad: list[str] = []
    grid = layout.rank_grid(cfg).reshape(example["pp"], example["dp"], example["tp"]).tolist()
    for axis in MESH_AXES:
        want = layout.groups(cfg, axis)
        containing = {r: g for g in want for r in g}
        seen = set()
        for rank, res in results_by_rank.items():
            got = res["groups"][axis]
            seen.add(tuple(got))
            if got != containing[rank]:
                bad.append(f"{axis} group of rank {rank}: torch {got[:8]}{'...' if len(got) > 8 else ''}, "
                           f"layout {containing[rank][:8]}{'...' if len(containing[rank]) > 8 else ''}")
                break
        if full_world and sorted(seen) != sorted(tuple(g) for g in want):
            bad.append(f"{axis}: torch created {len(seen)} groups, layout has {len(want)}")
    for rank, res in results_by_rank.items():
        if not np.array_equal(np.asarray(res["grid"]), np.asarray(grid)):
            bad.append(f"rank {rank}: mesh grid differs from layout.rank_grid")
            break
    return bad


def mesh_rows(world: World, examples: Sequence[dict] | None = None, order: str = "tp-dp-pp") -> list[CheckResult]:
    """The ``mesh.groups`` row on ``world``: every factorisation ``pp * dp * tp = world_size`` (or ``examples``).

    ``order`` is the layout's innermost-first axis order the torch mesh is
    compared with; the right one for a ``(pp, dp, tp)`` mesh is ``"tp-dp-pp"``
    (tests pass another to show the check fails).
    """
    ws, be = world.world_size, world.backend
    exs = list(examples) if examples else [
        {"pp": pp, "dp": dp, "tp": ws // (pp * dp)}
        for pp in range(1, ws + 1) for dp in range(1, ws + 1) if ws % (pp * dp) == 0
    ]
    bad: list[str] = []
    for ex in exs:
        results, err = run_guarded(world, mesh_groups_rank, ex)
        if err:
            bad.append(f"{ex}: {err}")
            break
        assert results is not None, "run_guarded returns results when it returns no error"
        diffs = _compare(dict(enumerate(results)), ex, order, full_world=True)
        if diffs:
            bad.append(f"pp={ex['pp']}, dp={ex['dp']}, tp={ex['tp']}: {diffs[0]}")
            break
    what = "every factorisation enumerated" if not examples else "the meshes given"
    return [result_row("mesh.groups", be, ws, len(exs), not bad, bound=0.0,
                       detail=bad[0] if bad else
                       f"{len(exs)} meshes (pp, dp, tp), {what}: every group equals layout.groups (order {order})")]


def sample_ranks(pp: int, dp: int, tp: int) -> list[int]:
    """A few ranks spread over every axis: first, last, and one inside each axis's range."""
    ws = pp * dp * tp
    picks = {0, ws - 1, tp - 1, tp, tp * dp - 1, tp * dp, ws // 2 + tp // 2 + 1, (ws * 7) // 9}
    return sorted(r for r in picks if 0 <= r < ws)


def fake_mesh_rows(pp: int = 16, dp: int = 128, tp: int = 8, *, ranks: Sequence[int] | None = None,
                   order: str = "tp-dp-pp") -> list[CheckResult]:
    """``mesh.groups.fake``: a ``pp * dp * tp`` world (default 16,384 ranks) on torch's fake backend.

    Needs no world, and must run in a process without a default process group (the fake
    backend installs its own)."""
    from distcheck.engine.fake import run_fake

    ex = {"pp": check_positive_int("pp", pp), "dp": check_positive_int("dp", dp), "tp": check_positive_int("tp", tp)}
    ws = pp * dp * tp
    picks = list(ranks) if ranks is not None else sample_ranks(pp, dp, tp)
    results = {r: run_fake(mesh_groups_rank, ex, world_size=ws, rank=r) for r in picks}
    diffs = _compare(results, ex, order, full_world=False)
    return [result_row("mesh.groups.fake", "fake", ws, len(picks), not diffs, bound=0.0,
                       detail=diffs[0] if diffs else
                       f"pp={pp}, dp={dp}, tp={tp}: groups of ranks {picks} equal layout.groups; grid equal")]


def world_rows(world: World, *, timeout_s: float) -> list[CheckResult]:
    """The layers stage's rows of this package on one world (a pool's own timeout applies per step)."""
    return mesh_rows(world)


def world_free_rows() -> list[CheckResult]:
    """The 16,384-rank mesh on the fake backend (no world)."""
    return fake_mesh_rows()


def skip_rows(world_size: int, backend: str, reason: str) -> list[CheckResult]:
    """The ``mesh.groups`` skip row for a world ``backend`` cannot run here."""
    return [skip_row("mesh.groups", backend, world_size, reason)]
