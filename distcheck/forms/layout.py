"""Closed forms for the rank layout of 3D/4D parallelism (sympy only).

Registered names (docs/ARCHITECTURE.md): ``layout.world_size``,
``layout.world_size.ep_outside_dp``, ``layout.num_groups``,
``layout.weights_fraction_per_gpu``. The numpy reference is
:mod:`distcheck.layout`; this module does not import it.
"""

from __future__ import annotations

from distcheck.closed_form import ClosedForm, Input, register

__all__ = ["WORLD_SIZE", "WORLD_SIZE_EP_OUTSIDE_DP", "NUM_GROUPS", "WEIGHTS_FRACTION_PER_GPU"]

_tp = Input("tp", "tensor-parallel degree", "GPUs")
_pp = Input("pp", "pipeline-parallel degree (number of stages)", "GPUs")
_dp = Input("dp", "data-parallel degree (replicas)", "GPUs")
_cp = Input("cp", "context-parallel degree", "GPUs", default=1)
_ep = Input("ep", "expert-parallel degree, as its own mesh axis", "GPUs")


def _s(*inputs):
    return [i.symbol for i in inputs]


tp, pp, dp, cp, ep = _s(_tp, _pp, _dp, _cp, _ep)

WORLD_SIZE = register(ClosedForm(
    name="layout.world_size",
    expr=tp * cp * pp * dp,
    inputs=(_tp, _pp, _dp, _cp),
    unit="GPUs",
    source="Narayanan et al. 2021 (SC'21) §3.1: p*t*d = n; Llama 3 (Dubey et al. 2024) §3.3.2 and Table 4 (TP*CP*PP*DP); lesson §3 '3D parallelism'",
    description="GPUs in the world: the product of the tensor-, context-, pipeline- and data-parallel degrees (ep placed inside dp adds none)",
))

WORLD_SIZE_EP_OUTSIDE_DP = register(ClosedForm(
    name="layout.world_size.ep_outside_dp",
    expr=tp * cp * pp * dp * ep,
    inputs=(_tp, _pp, _dp, _ep, _cp),
    unit="GPUs",
    source="layout.world_size with expert parallelism as an extra mesh axis (torchtitan ParallelDims when ep is not borrowed from dp)",
    description="GPUs in the world when expert parallelism is its own axis outside data parallelism: tp*cp*pp*dp*ep",
))

_world = Input("world_size", "ranks in the world", "GPUs")
_degree = Input("degree", "degree of the axis whose groups are counted", "GPUs")
world_size, degree = _s(_world, _degree)

NUM_GROUPS = register(ClosedForm(
    name="layout.num_groups",
    expr=world_size / degree,
    inputs=(_world, _degree),
    unit="count",
    source="the groups of one axis partition the world into world_size/degree groups of degree ranks (Narayanan et al. 2021 §3.1 notation)",
    description="number of process groups of one parallel axis, e.g. dp groups = world_size/dp",
    constraints=("degree divides world_size",),
))

WEIGHTS_FRACTION_PER_GPU = register(ClosedForm(
    name="layout.weights_fraction_per_gpu",
    expr=1 / (tp * pp),
    inputs=(_tp, _pp),
    unit="fraction",
    source="lesson §3 '3D parallelism' (1/(t*p) = 1/128 for t=8, p=16)",
    description="fraction of the dense weights one GPU holds when TP splits matrices and PP splits layers (dp replicates; no ZeRO sharding)",
))
