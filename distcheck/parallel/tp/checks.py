"""Tensor parallelism on a real world: its rows of ``distcheck check``'s layers stage.

torch's DTensor tensor parallelism (``parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel``) on the Megatron MLP and on grouped-query attention, certified under the
tensor-parallel contracts (:mod:`distcheck.parallel.tp.contracts`) with the plans of
:mod:`distcheck.parallel.tp.plans` on every world of the stage, tp = the world size:
Hypothesis draws the widths, heads, inputs, weights and output gradients in the parent for
float64, float32 and bfloat16, every example runs on every rank of the pool, failures are
shrunk there. Rows ``tp.<block>.<property>[<dtype>]`` (forward, input_grad, param_grads,
collectives.forward, collectives.backward), each with its example count. The MLP is bitwise
(on tp that are powers of two; elsewhere DTensor's ``b / tp`` share of the replicated bias
rounds and the output is held to a derived bound), attention within its derived bound.
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "STAGE"]

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"

CERTIFY = (
    ContractRun("tp.mlp", "tensor-parallel-mlp", "distcheck.parallel.tp.plans:MEGATRON_MLP",
                doc="torch's ColwiseParallel + RowwiseParallel on the Megatron MLP"),
    ContractRun("tp.attention", "tensor-parallel-attention", "distcheck.parallel.tp.plans:MEGATRON_ATTENTION",
                doc="torch's plan on grouped-query attention, heads split, the block's input prepared once"),
)
