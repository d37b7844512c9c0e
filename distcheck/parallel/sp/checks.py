"""Sequence parallelism on a real world: its rows of ``distcheck check``'s layers stage.

torch's ``SequenceParallel`` on the layer norm with the tensor-parallel plan on the MLP
(:data:`distcheck.parallel.sp.plans.SEQUENCE_PARALLEL_MLP`), certified under the
``sequence-parallel-mlp`` contract (:mod:`distcheck.parallel.sp.contracts`) on every world of the stage
from two ranks: Hypothesis draws the tokens, weights and output gradients in the parent, every example
runs on every rank of the pool against the tensor-parallel block on the whole sequence. Rows
``sp.mlp.<property>[<dtype>]`` (forward, input_grad, param_grads, collectives.forward,
collectives.backward, collectives.grad_sums), each with its example count.
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "STAGE"]

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"

CERTIFY = (
    ContractRun("sp.mlp", "sequence-parallel-mlp", "distcheck.parallel.sp.plans:SEQUENCE_PARALLEL_MLP",
                dtypes=("float32", "bfloat16"),
                doc="torch's SequenceParallel layer norm with ColwiseParallel(Shard(1)) and RowwiseParallel(Shard(1))"),
)
