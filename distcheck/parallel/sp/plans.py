"""torch's sequence-parallel plans for distcheck's pre-norm MLP block (``norm``, ``up``, ``down``), built on
first use; targets of the ``sequence-parallel-mlp`` contract
(``distcheck certify distcheck.parallel.sp.plans:SEQUENCE_PARALLEL_MLP --contract sequence-parallel-mlp``).

* ``SEQUENCE_PARALLEL_MLP``: ``norm`` ``SequenceParallel()`` (the layer norm on the sequence shards),
  ``up`` ``ColwiseParallel(input_layouts=Shard(1))`` (its input all-gathered from the shards: Megatron's
  g), ``down`` ``RowwiseParallel(output_layouts=Shard(1))`` (its partial outputs reduce-scattered to the
  shards: g-bar). Korthikanti et al. 2022, §4.2.2, Figure 5; torch's tensor-parallel tutorial.
* ``TENSOR_PARALLEL_MLP``: the same block with tensor parallelism alone (``norm`` replicated, ``up``
  ``ColwiseParallel()``, ``down`` ``RowwiseParallel()``): not a target of the contract (it takes the whole
  sequence, not each rank's tokens) but the reference the contract compares a target with.
* ``UNSHARDED_NORM_MLP``: a mis-set plan: the MLP reduce-scatters to the shards but ``norm`` is not
  marked ``SequenceParallel``, so the block takes a replicated input: shapes and collectives go wrong.

torch is imported when a plan is first asked for; the same object is returned every time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from distcheck.engine.contracts.targets import built_on_first_use

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["SEQUENCE_PARALLEL_MLP", "TENSOR_PARALLEL_MLP", "UNSHARDED_NORM_MLP"]

#: a plan: module path -> parallel style (the argument ``parallelize_plan`` of ``parallelize_module``)
Plan = dict[str, "ParallelStyle"]

# declared, not bound: the module ``__getattr__`` builds each plan on first access
SEQUENCE_PARALLEL_MLP: Plan
TENSOR_PARALLEL_MLP: Plan
UNSHARDED_NORM_MLP: Plan


def _sequence_parallel() -> Plan:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))}


def _tensor_parallel() -> Plan:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def _unsharded_norm() -> Plan:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"up": ColwiseParallel(), "down": RowwiseParallel(output_layouts=Shard(1))}


_PLANS: dict[str, Callable[[], Plan]] = {
    "SEQUENCE_PARALLEL_MLP": _sequence_parallel, "TENSOR_PARALLEL_MLP": _tensor_parallel,
    "UNSHARDED_NORM_MLP": _unsharded_norm,
}

__getattr__, __dir__ = built_on_first_use(__name__, _PLANS)
