"""paper: "Demons in the Detail: On Implementing Load Balancing Loss for Training Specialized Mixture-of-Expert
Models" (Qiu et al., ACL 2025, arXiv:2501.11873), the abstract and its global-batch method.

The load-balancing loss ``E sum_e f_e P_e`` is defined over the batch; the paper reports that MoE training
frameworks compute ``f_e`` and the loss within each rank's micro-batch and average the losses across the parallel
groups, which is a different, stricter loss (nearly per sequence) than the global batch's, and synchronizes
``f_e`` across the ranks to compute the global one. Re-created in plain torch: distcheck's tiny Llama with MoE
layers, each rank's load-balancing loss from its own tokens' routing (examples/step_mutants.py, aux_loss_per_rank),
FSDP2's average making it the mean over the ranks, under dp_shard = 2, ep = 2 (torchtitan's placement); the twin is
the default loss, the load-balancing loss of the whole micro-batch's routing."""

from __future__ import annotations

from distcheck.zoo import Entry
from examples.step_mutants import AUX_LOSS_PER_RANK
from zoo._step import FIXED

ENTRY = Entry(
    reference="paper: Demons in the Detail (Qiu et al., ACL 2025, arXiv:2501.11873), abstract",
    url="https://arxiv.org/abs/2501.11873",
    library="MoE training frameworks (as the paper describes them; Megatron-style micro-batch LBL)",
    versions="before the global-batch LBL (January 2025)",
    bug_class="MoE auxiliary loss across ranks: each rank's own tokens' loss averaged",
    contract="training-step", property="grad_norm",
    bug=AUX_LOSS_PER_RANK, fixed=FIXED,
    summary="each rank's load-balancing loss of its own tokens, averaged over the ranks, not the batch's loss",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2,ep=2"},
)
