"""Checkpoints on a real world: their rows of ``distcheck check``'s layers stage.

torch.distributed.checkpoint (``dcp.save`` / ``dcp.load`` with ``get_state_dict`` / ``set_state_dict``)
certified under the ``checkpoint`` contract (:mod:`distcheck.parallel.checkpoint.contracts`) on every world
of the stage from 2 ranks: Hypothesis draws the tensors, Adam's steps and two layouts (replicated, FSDP2,
DTensor tp) in the parent, every example saves and loads on every rank of the pool. Rows
``checkpoint.dcp.round_trip``, ``.next_step`` and ``.bytes`` (per dtype), each with its example count.

Two world-free rows say what DCP guarantees of a save killed before its commit (the rename of
``.metadata``; :mod:`distcheck.parallel.checkpoint.dcp_atomic`): ``checkpoint.dcp.interrupted_save``
(into a new folder: the previous checkpoint loads whole; ``pass``) and
``checkpoint.dcp.interrupted_overwrite`` (over the previous checkpoint's folder: a ``skip`` naming what the
load gave, torch 2.13 giving the uncommitted save's values; DCP does not claim it, and a save per folder,
or :func:`distcheck.parallel.checkpoint.save_swap`'s pointer swap, avoids it).
"""

from __future__ import annotations

from distcheck.core.results import CheckResult
from distcheck.engine.contracts.contract import ContractRun
from distcheck.engine.drivers import result_row, skip_row

__all__ = ["CERTIFY", "PRELOAD", "STAGE", "world_free_rows", "OVERWRITE_REASON"]

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
