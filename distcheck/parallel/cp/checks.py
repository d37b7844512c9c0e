"""Context parallelism on a real world: its rows of ``distcheck check``'s layers stage.

torch's ``context_parallel`` (:data:`distcheck.parallel.cp.plans.TORCH_CONTEXT_PARALLEL`) under the
``context-parallel-attention`` contract on every world of the stage from two ranks; without a GPU its
rows are ``skip`` with torch 2.13's refusal of the CPU attention op (:data:`~distcheck.parallel.cp.plans.
CPU_REFUSAL`). The plain torch.distributed ring of ``examples/my_ring_attention.py`` is certified by
``distcheck certify`` (``tests/test_cp.py``).
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "STAGE"]

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"

CERTIFY = (
    ContractRun("cp.torch_context_parallel", "context-parallel-attention",
                "distcheck.parallel.cp.plans:TORCH_CONTEXT_PARALLEL", dtypes=("float32",),
                doc="torch's context_parallel ring attention on head-tail shards (GPU only in torch 2.13)"),
)
