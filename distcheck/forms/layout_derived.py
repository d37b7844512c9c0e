"""Closed forms of a parallel degree derived from the world size and the other degrees (sympy only).

Frameworks let one degree be implied: torchtitan's ``data_parallel_shard_degree = -1``,
a planner's "dp = GPUs / (tp x pp)". With expert parallelism the derivation depends on
where ep is placed (:mod:`distcheck.layout`): carved out of the data-parallel ranks
(torchtitan, Megatron-core's default), ``dp = world_size / (tp cp pp)``; as its own
mesh axis outside dp, ``dp = world_size / (tp cp pp ep)``. A world size the other
degrees do not divide gives no whole degree (the audit says so).

Registered names: ``layout.dp_from_world_size`` and
``layout.dp_from_world_size.ep_outside_dp``.
"""

from __future__ import annotations

from distcheck.closed_form import ClosedForm, Input, register

__all__ = ["DP_FROM_WORLD_SIZE", "DP_FROM_WORLD_SIZE_EP_OUTSIDE_DP"]

_W = Input("world_size", "ranks in the world", "GPUs")
_tp = Input("tp", "tensor-parallel degree", "GPUs", default=1)
_pp = Input("pp", "pipeline-parallel degree", "GPUs", default=1)
_cp = Input("cp", "context-parallel degree", "GPUs", default=1)
_ep = Input("ep", "expert-parallel degree", "GPUs")
_ep_inside = Input("ep", "expert-parallel degree, carved from the dp*cp ranks (it does not change dp)", "GPUs",
                   default=1)
W, tp, pp, cp, ep = (i.symbol for i in (_W, _tp, _pp, _cp, _ep))

DP_FROM_WORLD_SIZE = register(ClosedForm(
    name="layout.dp_from_world_size",
    expr=W / (tp * cp * pp),
    inputs=(_W, _tp, _pp, _cp, _ep_inside),
    unit="GPUs",
    source="torchtitan ParallelDims (dp_shard = -1 is world_size / (dp_replicate cp tp pp)); Megatron-core "
           "initialize_model_parallel (data_parallel_size = world_size / (tp pp cp)); Narayanan et al. 2021 §3.1",
    description="data-parallel degree implied by the world size and the other degrees, ep carved out of dp "
                "(no extra GPUs): world_size / (tp cp pp)",
    constraints=("tp*cp*pp divides world_size",),
))

DP_FROM_WORLD_SIZE_EP_OUTSIDE_DP = register(ClosedForm(
    name="layout.dp_from_world_size.ep_outside_dp",
    expr=W / (tp * cp * pp * ep),
    inputs=(_W, _ep, _tp, _pp, _cp),
    unit="GPUs",
    source="layout.world_size.ep_outside_dp solved for dp (expert parallelism as its own mesh axis)",
    description="data-parallel degree implied by the world size when ep is its own axis outside dp: "
                "world_size / (tp cp pp ep)",
    constraints=("tp*cp*pp*ep divides world_size",),
))
