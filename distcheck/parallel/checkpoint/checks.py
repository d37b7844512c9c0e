"""Checkpoints on a real world: their rows of ``distcheck check``'s layers stage.

torch.distributed.checkpoint (``dcp.save`` / ``dcp.load`` with ``get_state_dict`` / ``set_state_dict``)
certified under the ``checkpoint`` contract (:mod:`distcheck.parallel.checkpoint.contracts`) on every world
of the stage from 2 ranks: Hypothesis draws the tensors, Adam's steps and two layouts (replicated, FSDP2,
DTensor tp) in the parent, every example saves and loads on every rank of the pool. Rows
``checkpoint.dcp.round_trip``, ``.next_step`` and ``.bytes`` (per dtype), each with its example count.
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "PRELOAD", "STAGE"]

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"
#: imported by a pool's parent before forking (their first use is slow on every rank)
PRELOAD = ("torch.distributed.fsdp", "torch.distributed.checkpoint")

CERTIFY = (
    ContractRun("checkpoint.dcp", "checkpoint", "distcheck.parallel.checkpoint.plans:TORCH_DCP",
                doc="torch.distributed.checkpoint: saved under one layout, loaded under another"),
)
