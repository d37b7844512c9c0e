"""Context parallelism on a real world: its rows of ``distcheck check``'s layers stage.

Under the ``context-parallel-attention`` contract (:mod:`distcheck.parallel.cp.contracts`), on every world of
the stage from two ranks, in float32: Hypothesis draws q, k, v and the output gradient in the parent, every
example runs on every rank of the pool against full attention in float64. Rows ``cp.<target>.<property>``
(forward, grads), each with its example count:

* ``cp.all_gather``: Llama 3's all-gather of K and V in plain torch.distributed
  (:data:`distcheck.parallel.cp.plans.ALL_GATHER_ATTENTION`);
* ``cp.ulysses``: DeepSpeed-Ulysses' all-to-alls in plain torch.distributed
  (:data:`distcheck.parallel.cp.plans.ULYSSES_ATTENTION`);
* ``cp.torch_context_parallel``: torch's ``context_parallel``
  (:data:`distcheck.parallel.cp.plans.TORCH_CONTEXT_PARALLEL`); without a GPU its rows are ``skip`` with
  torch 2.13's refusal of the CPU attention op (:data:`~distcheck.parallel.cp.plans.CPU_REFUSAL`).

Each plain target takes at most five examples per property (every example is a forward and backward
of every rank: the two add about 5 s to the stage on two CPU cores). The ring of
``examples/my_ring_attention.py`` is certified by ``distcheck certify`` (``tests/test_cp.py``).
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "STAGE"]

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"

_CONTRACT = "context-parallel-attention"
_PLANS = "distcheck.parallel.cp.plans"

CERTIFY = (
    ContractRun("cp.all_gather", _CONTRACT, f"{_PLANS}:ALL_GATHER_ATTENTION", dtypes=("float32",), max_examples=5,
                doc="Llama 3's all-gather of K and V in plain torch.distributed (all_gather_into_tensor; "
                    "reduce_scatter_tensor in the backward) on head-tail shards"),
    ContractRun("cp.ulysses", _CONTRACT, f"{_PLANS}:ULYSSES_ATTENTION", dtypes=("float32",), max_examples=5,
                doc="DeepSpeed-Ulysses' all-to-alls in plain torch.distributed (all_to_all_single, sequence "
                    "shards to head shards and back) on head-tail shards"),
    ContractRun("cp.torch_context_parallel", _CONTRACT, f"{_PLANS}:TORCH_CONTEXT_PARALLEL", dtypes=("float32",),
                doc="torch's context_parallel ring attention on head-tail shards (GPU only in torch 2.13)"),
)
