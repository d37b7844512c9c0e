"""Checkpoints on a real world: their rows of ``distcheck check``'s layers stage.

torch.distributed.checkpoint (``dcp.save`` / ``dcp.load`` with ``get_state_dict`` / ``set_state_dict``)
certified under the ``checkpoint`` contract (:mod:`distcheck.parallel.checkpoint.contracts`) on every world
of the stage from 2 ranks: Hypothesis draws the tensors, Adam's steps and two layouts (replicated, FSDP2,
DTensor tp) in the parent, every example saves and loads on every rank of the pool. Rows
``checkpoint.dcp.round_trip``, ``.next_step`` and ``.bytes`` (per dtype), each with its example count.

From 4 ranks, ``checkpoint.fsdp_tp.empty_tp_shard`` checks what the contract's 2-D layout relies on: each
rank's local shard of a (1, 1) tensor under ``fsdp_tp`` with tp along dim 1 (tp rank 1 holds no column) is
the box its placements give (:func:`distcheck.parallel.checkpoint.shard_boxes`). torch 2.13 gives rank 1 a
(0, 0) shard where its placements give (1, 0), and ``full_tensor()`` then hangs: the recorded finding
``torch.fully_shard.empty_tp_shard`` (:mod:`distcheck.parallel.checkpoint.findings`), which the contract's
cases avoid. The row reads the shapes only: it calls no collective that could hang. Below 4 ranks it is a
``skip`` (no 2-D mesh).

Two world-free rows say what DCP guarantees of a save killed before its commit (the rename of
``.metadata``; :mod:`distcheck.parallel.checkpoint.dcp_atomic`): ``checkpoint.dcp.interrupted_save``
(into a new folder: the previous checkpoint loads whole; ``pass``) and
``checkpoint.dcp.interrupted_overwrite`` (over the previous checkpoint's folder: a ``skip`` naming what the
load gave, torch 2.13 giving the uncommitted save's values; DCP does not claim it, and a save per folder,
or :func:`distcheck.parallel.checkpoint.save_swap`'s pointer swap, avoids it).
"""

from __future__ import annotations

from typing import Any

from distcheck.core.results import CheckResult
from distcheck.engine.contracts.contract import ContractRun
from distcheck.engine.drivers import result_row, run_guarded, skip_row
from distcheck.engine.world import RankContext, World

__all__ = ["CERTIFY", "PRELOAD", "STAGE", "world_free_rows", "world_rows", "skip_rows", "OVERWRITE_REASON",
           "EMPTY_TP_SHARD_CHECK", "empty_tp_shard_rank", "empty_tp_shard_row"]

#: why the overwrite row is a skip, with what the load gave
OVERWRITE_REASON = ("torch.distributed.checkpoint does not make a save over an existing checkpoint_id atomic: it "
                    "rewrites the __R_0.distcp files before renaming .metadata, so a save killed in between leaves "
                    "the old .metadata naming the new data (a load gave: {outcome}); save each checkpoint to a new "
                    "folder (the previous one is then kept whole), or use distcheck's save_swap")

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"
#: imported by a pool's parent before forking (their first use is slow on every rank)
PRELOAD = ("torch.distributed.fsdp", "torch.distributed.checkpoint")

CERTIFY = (
    ContractRun("checkpoint.dcp", "checkpoint", "distcheck.parallel.checkpoint.plans:TORCH_DCP",
                doc="torch.distributed.checkpoint: saved under one layout, loaded under another"),
)


def world_free_rows() -> list[CheckResult]:
    """The two interrupted-save rows (module doc), run in this process in a temporary folder."""
    import tempfile

    from distcheck.parallel.checkpoint.dcp_atomic import interrupted_saves

    with tempfile.TemporaryDirectory(prefix="distcheck-dcp-") as root:
        seen = interrupted_saves(root)
    rows = [result_row("checkpoint.dcp.interrupted_save", "local", 1, 1, seen["new_id"] == "old",
                       detail=f"a save into a new folder killed before .metadata's rename: the previous checkpoint "
                       f"loads {seen['new_id']}")]
    if seen["same_id"] == "old":
        rows.append(result_row("checkpoint.dcp.interrupted_overwrite", "local", 1, 1, True,
                               detail="a save over the previous folder killed before its commit: the previous "
                                      "checkpoint loads whole"))
    else:
        rows.append(skip_row("checkpoint.dcp.interrupted_overwrite", "local", 1,
                             OVERWRITE_REASON.format(outcome=seen["same_id"])))
    return rows


#: the row of FSDP2's empty tp shard (module doc; the finding torch.fully_shard.empty_tp_shard)
EMPTY_TP_SHARD_CHECK = "checkpoint.fsdp_tp.empty_tp_shard"
_SHAPE, _DIM = (1, 1), 1  # the smallest case: one element, tp along dim 1 (tp rank 1 holds no column)


def empty_tp_shard_rank(ctx: RankContext, shape: tuple[int, ...], dim: int) -> tuple[tuple[int, ...], str]:
    """Rank side: one tensor of ``shape`` built as the checkpoint contract builds ``fsdp_tp`` (tp along ``dim``,
    then ``fully_shard`` on dp); return its local shard's shape and its placements (no collective is called on
    the tensor)."""
    from types import SimpleNamespace

    import numpy as np

    from distcheck.parallel.checkpoint.harness import build

    model, _ = build(ctx, SimpleNamespace(params=(np.ones(shape),), dtype="float64"), "fsdp_tp", (dim,))
    p: Any = model.t0
    return tuple(p.to_local().shape), str(tuple(p.placements))


def empty_tp_shard_row(world: World) -> CheckResult:
    """The ``checkpoint.fsdp_tp.empty_tp_shard`` row on ``world`` (module doc): pass when every rank's local
    shard is its box in :func:`~distcheck.parallel.checkpoint.shard_boxes`."""
    from distcheck.parallel.checkpoint.reference import layouts_at, shard_boxes

    ws, be = world.world_size, world.backend
    what = f"a {_SHAPE} tensor under fsdp_tp (tp along dim {_DIM}) at {ws} ranks"
    if "fsdp_tp" not in layouts_at(ws):
        return skip_row(EMPTY_TP_SHARD_CHECK, be, ws, f"{what}: no 2-D (dp, tp) mesh below 4 ranks or on an odd "
                                                      "world")
    results, err = run_guarded(world, empty_tp_shard_rank, _SHAPE, _DIM)
    if err is not None or results is None:
        return result_row(EMPTY_TP_SHARD_CHECK, be, ws, 1, False, detail=f"{what}: {err}")
    want = [tuple(hi - lo for lo, hi in box) for box in shard_boxes(_SHAPE, "fsdp_tp", _DIM, ws)]
    bad = [r for r, ((got, _), box) in enumerate(zip(results, want, strict=True)) if got != box]
    if not bad:
        return result_row(EMPTY_TP_SHARD_CHECK, be, ws, 1, True, bound=0.0,
                          detail=f"{what}: every rank's local shard is the box its placements give")
    r = bad[0]
    also = f" (also ranks {bad[1:]})" if bad[1:] else ""
    return result_row(EMPTY_TP_SHARD_CHECK, be, ws, 1, False, bound=0.0,
                      detail=f"{what}: rank {r}'s local shard is {results[r][0]} where its placements "
                             f"{results[r][1]} give {want[r]}{also}; full_tensor() then all-gathers unequal shards "
                             "over tp and hangs")


def world_rows(world: World, *, timeout_s: float) -> list[CheckResult]:
    """The layers stage's row of this package on one world (module doc; the pool's own timeout applies)."""
    return [empty_tp_shard_row(world)]


def skip_rows(world_size: int, backend: str, reason: str) -> list[CheckResult]:
    """The ``checkpoint.fsdp_tp.empty_tp_shard`` skip row for a world ``backend`` cannot run here."""
    return [skip_row(EMPTY_TP_SHARD_CHECK, backend, world_size, reason)]
