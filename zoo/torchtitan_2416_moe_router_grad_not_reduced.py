"""pytorch/torchtitan#2416: "Force all reduce in bwd for router at MoE boundary" (fixing the report #2387).

The MoE router (the gate) is replicated while each rank routes its own tokens, so each rank's gradient of the
gate is a partial sum; torchtitan marked it Replicated without the all-reduce in the backward, and the router
weights diverged from rank to rank. Re-created in plain torch: the GShard-style layer of examples/my_moe.py
whose router gradient is left as this rank's share (no all-reduce), under ep = 2."""

from __future__ import annotations

from distcheck.zoo import Entry
from examples.my_moe import MoE


class RouterGradNotReduced(MoE):
    """The layer with the router's gradient never all-reduced over the ranks."""

    def grads(self):
        return {"wg": None if self.wg.grad is None else self.wg.grad.clone(), "w1": self.w1.grad, "w2": self.w2.grad}


def make_router_grad_not_reduced(ctx, spec):
    """The buggy layer (module doc)."""
    return RouterGradNotReduced(spec)


ENTRY = Entry(
    reference="pytorch/torchtitan#2416",
    url="https://github.com/pytorch/torchtitan/pull/2416",
    library="torchtitan (MoE, expert parallelism)", versions="before February 2026",
    bug_class="MoE router gradients across ranks",
    contract="moe-layer", property="grads",
    bug=make_router_grad_not_reduced, fixed="examples.my_moe:make",
    summary="the replicated router's gradient left as each rank's partial sum: router weights drift apart",
    reproduction="plain torch re-creation",
)
