"""torch's own tensor-parallel plans, as ``distcheck check`` certifies them, built on first use.

Each name is a dict of ``torch.distributed.tensor.parallel`` styles (a plan for
``parallelize_module``), a target of the tensor-parallel contracts
(``distcheck certify distcheck.parallel.tp.plans:MEGATRON_MLP --contract tensor-parallel-mlp``).
torch is imported when a plan is first asked for; the same object is returned every time, so
a plan is found again on every rank by its name.

* ``MEGATRON_MLP``: ``up`` ``ColwiseParallel``, ``down`` ``RowwiseParallel`` (Megatron-LM's
  layout, Shoeybi et al. 2019, §3).
* ``MEGATRON_ATTENTION``: ``q_proj``, ``k_proj``, ``v_proj`` ``ColwiseParallel`` (whole heads per
  rank), ``o_proj`` ``RowwiseParallel``, and the block's input prepared as a replicated DTensor
  (``PrepareModuleInput(..., use_local_output=False)``): without it each projection all-reduces
  its own input gradient, three all-reduces where Megatron has one.
* ``COLWISE_DOWN_MLP``: a mis-set plan, ``down`` column-parallel with a gathered input: the right
  numbers with the wrong collectives (two all-gathers where one all-reduce belongs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from distcheck.engine.contracts.targets import built_on_first_use

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["MEGATRON_MLP", "MEGATRON_ATTENTION", "COLWISE_DOWN_MLP"]

#: a plan: module path -> parallel style (the argument ``parallelize_plan`` of ``parallelize_module``)
Plan = dict[str, "ParallelStyle"]

# declared, not bound: the module ``__getattr__`` builds each plan on first access
MEGATRON_MLP: Plan
MEGATRON_ATTENTION: Plan
COLWISE_DOWN_MLP: Plan



def _megatron_mlp() -> Plan:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def _megatron_attention() -> Plan:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    return {"": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                   use_local_output=False),
            "q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel(),
            "o_proj": RowwiseParallel()}


def _colwise_down_mlp() -> Plan:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    return {"up": ColwiseParallel(), "down": ColwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate())}


_PLANS: dict[str, Callable[[], Plan]] = {
    "MEGATRON_MLP": _megatron_mlp, "MEGATRON_ATTENTION": _megatron_attention, "COLWISE_DOWN_MLP": _colwise_down_mlp,
}


__getattr__, __dir__ = built_on_first_use(__name__, _PLANS)
