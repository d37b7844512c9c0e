"""huggingface/transformers#48205: "Fix expert-parallel training: NaN gradients and missing gradient
contributions" (the report: huggingface/transformers#48687, wrong router gradient under expert parallelism).

Under expert parallelism each rank's gradient of the router scores covers only its local experts' slots; without
summing those partials over the ranks the router gets the wrong gradient while the loss stays right, "so nothing
in a training run looks off". Re-created in plain torch: the GShard-style layer of examples/my_moe.py whose
router gradient stays this rank's partial sum, under ep = 2."""

from __future__ import annotations

from distcheck.zoo import Entry
from examples.my_moe import MoE


class RouterGradPartial(MoE):
    """The layer with the router's gradient left as this rank's partial sum."""

    def grads(self):
        return {"wg": None if self.wg.grad is None else self.wg.grad.clone(), "w1": self.w1.grad, "w2": self.w2.grad}


def make_router_grad_partial(ctx, spec):
    """The buggy layer (module doc)."""
    return RouterGradPartial(spec)


ENTRY = Entry(
    reference="huggingface/transformers#48205",
    url="https://github.com/huggingface/transformers/pull/48205",
    library="transformers (expert parallelism)", versions="main at c694707 (September 2026)",
    bug_class="MoE router gradients across ranks",
    contract="moe-layer", property="grads",
    bug=make_router_grad_partial, fixed="examples.my_moe:make",
    summary="the router's gradient misses the other ranks' experts' contributions; the loss stays right",
    reproduction="plain torch re-creation",
)
