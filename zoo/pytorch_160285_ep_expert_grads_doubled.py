"""pytorch/pytorch#160285: "Wrong-size gradients in Expert Parallel MoE".

With torchtitan's EP + MoE layer on two ranks, every expert gradient came out exactly twice its size (ep times),
while the loss curves looked the same. The report does not settle the cause; this entry re-creates the reported
symptom in plain torch: the GShard-style layer of examples/my_moe.py whose local experts' gradients are scaled by
ep (as an all-reduce that sums where the ranks' expert shards should be left alone), under ep = 2."""

from __future__ import annotations

from distcheck.zoo import Entry
from examples.my_moe import MoE


class ExpertGradsTimesEp(MoE):
    """The layer with each local expert's gradient multiplied by ep."""

    def grads(self):
        out = super().grads()
        ep = self.spec.ep
        return {k: (v * ep if k in ("w1", "w2") and v is not None else v) for k, v in out.items()}


def make_expert_grads_times_ep(ctx, spec):
    """The buggy layer (module doc)."""
    return ExpertGradsTimesEp(spec)


ENTRY = Entry(
    reference="pytorch/pytorch#160285",
    url="https://github.com/pytorch/pytorch/issues/160285",
    library="torch / torchtitan (EP MoE)", versions="as reported, August 2025",
    bug_class="MoE expert gradients across ranks",
    contract="moe-layer", property="grads",
    bug=make_expert_grads_times_ep, fixed="examples.my_moe:make",
    summary="each expert's gradient ep times its size under expert parallelism; the loss unchanged",
    reproduction="plain torch re-creation",
)
