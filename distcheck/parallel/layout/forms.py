"""Closed forms for the rank layout of 3D/4D parallelism (sympy only).

Registered names (docs/ARCHITECTURE.md): ``layout.world_size``,
``layout.world_size.ep_outside_dp``, ``layout.num_groups``,
``layout.weights_fraction_per_gpu``, ``layout.dp_from_world_size`` and
``layout.dp_from_world_size.ep_outside_dp`` (a degree implied by the world size and the
others, as torchtitan's ``data_parallel_shard_degree = -1`` and a planner's
"dp = GPUs / (tp x pp)" state it, with ep inside or outside dp), and for the default axis order
``tp, cp, pp, dp`` (innermost first, Llama 3 §3.3.2): ``layout.rank`` (rank
from coordinates), ``layout.coordinate.{tp,cp,pp,dp}`` (coordinates from the
rank) and ``layout.tp_groups_node_local`` (1 when every TP group is inside one
node). The numpy reference is
:mod:`distcheck.parallel.layout`; this module does not import it.
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = [
    "WORLD_SIZE",
    "WORLD_SIZE_EP_OUTSIDE_DP",
    "NUM_GROUPS",
    "WEIGHTS_FRACTION_PER_GPU",
    "RANK",
    "COORDINATE",
    "TP_GROUPS_NODE_LOCAL",
    "DP_FROM_WORLD_SIZE",
    "DP_FROM_WORLD_SIZE_EP_OUTSIDE_DP",
]

_tp = Input("tp", "tensor-parallel degree", "GPUs")
_pp = Input("pp", "pipeline-parallel degree (number of stages)", "GPUs")
_dp = Input("dp", "data-parallel degree (replicas)", "GPUs")
_cp = Input("cp", "context-parallel degree", "GPUs", default=1)
_ep = Input("ep", "expert-parallel degree, as its own mesh axis", "GPUs")


def _s(*inputs: Input) -> list[sp.Symbol]:
    return [i.symbol for i in inputs]


tp, pp, dp, cp, ep = _s(_tp, _pp, _dp, _cp, _ep)

WORLD_SIZE = register(ClosedForm(
    name="layout.world_size",
    expr=tp * cp * pp * dp,
    inputs=(_tp, _pp, _dp, _cp),
    unit="GPUs",
    source="Narayanan et al. 2021 (SC'21) §3.1: p*t*d = n; Llama 3 (Dubey et al. 2024) §3.3.2 and Table 4 "
           "(TP*CP*PP*DP); lesson §3 '3D parallelism'",
    description="GPUs in the world: the product of the tensor-, context-, pipeline- and data-parallel degrees "
                "(ep placed inside dp adds none)",
))

WORLD_SIZE_EP_OUTSIDE_DP = register(ClosedForm(
    name="layout.world_size.ep_outside_dp",
    expr=tp * cp * pp * dp * ep,
    inputs=(_tp, _pp, _dp, _ep, _cp),
    unit="GPUs",
    source="layout.world_size with expert parallelism as an extra mesh axis "
           "(torchtitan ParallelDims when ep is not borrowed from dp)",
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
    source="the groups of one axis partition the world into world_size/degree groups of degree ranks "
           "(Narayanan et al. 2021 §3.1 notation)",
    description="number of process groups of one parallel axis, e.g. dp groups = world_size/dp",
    constraints=("degree divides world_size",),
))

WEIGHTS_FRACTION_PER_GPU = register(ClosedForm(
    name="layout.weights_fraction_per_gpu",
    expr=1 / (tp * pp),
    inputs=(_tp, _pp),
    unit="fraction",
    source="lesson §3 '3D parallelism' (1/(t*p) = 1/128 for t=8, p=16)",
    description="fraction of the dense weights one GPU holds when TP splits matrices and PP splits layers "
                "(dp replicates; no ZeRO sharding)",
))

# --- rank <-> coordinates, default order tp, cp, pp, dp (innermost first)

_ORDER_SRC = ("Llama 3 (Dubey et al. 2024) §3.3.2: order [TP, CP, PP, DP] innermost first; "
              "torch init_device_mesh row-major layout with mesh_shape (dp, pp, cp, tp)")
_idx = {a: Input(f"{a}_index", f"index along the {a} axis, 0-based", "", kind="nonnegative_integer", default=0)
        for a in ("tp", "cp", "pp", "dp")}
_rank_in = Input("rank", "global rank, 0-based", "", kind="nonnegative_integer")
_cp_deg = Input("cp", "context-parallel degree", "GPUs", default=1)
_tp_s, _cp_s, _pp_s = _tp.symbol, _cp_deg.symbol, _pp.symbol
_t, _c, _p, _d = (_idx[a].symbol for a in ("tp", "cp", "pp", "dp"))

RANK = register(ClosedForm(
    name="layout.rank",
    expr=_t + _tp_s * (_c + _cp_s * (_p + _pp_s * _d)),
    inputs=(_idx["tp"], _idx["cp"], _idx["pp"], _idx["dp"], _tp, _cp_deg, _pp),
    unit="count",
    source=_ORDER_SRC,
    description="global rank of the given coordinates in the default order (tp innermost): "
                "tp_index + tp*(cp_index + cp*(pp_index + pp*dp_index))",
    constraints=("0 <= tp_index < tp, 0 <= cp_index < cp, 0 <= pp_index < pp, 0 <= dp_index < dp",),
))

_rank = _rank_in.symbol
_stride = {"tp": sp.Integer(1), "cp": _tp_s, "pp": _tp_s * _cp_s, "dp": _tp_s * _cp_s * _pp_s}
_deg_in = {"tp": _tp, "cp": _cp_deg, "pp": _pp}
#: axis -> the degrees inner to it (their product is the axis' stride)
_INNER = {"tp": (), "cp": ("tp",), "pp": ("tp", "cp"), "dp": ("tp", "cp", "pp")}

COORDINATE: dict[str, ClosedForm] = {}
for _a, _inner in _INNER.items():
    _q = sp.floor(_rank / _stride[_a])
    _outer = _a == "dp"  # outermost: no modulo, since rank < world_size
    COORDINATE[_a] = register(ClosedForm(
        # builds layout.coordinate.cp, layout.coordinate.dp, layout.coordinate.pp, layout.coordinate.tp
        name=f"layout.coordinate.{_a}",
        expr=_q if _outer else sp.Mod(_q, _deg_in[_a].symbol),
        inputs=(_rank_in,) + tuple(_deg_in[b] for b in _inner) + (() if _outer else (_deg_in[_a],)),
        unit="count",
        source=_ORDER_SRC,
        description=f"index of `rank` along the {_a} axis in the default order: "
                    + ("floor(rank / (tp*cp*pp))" if _outer else
                       f"floor(rank / stride) mod {_a}, stride = product of the degrees inner to {_a}"),
        constraints=("0 <= rank < tp*cp*pp*dp",),
    ))

_g = Input("gpus_per_node", "GPUs per node (server)", "GPUs")

TP_GROUPS_NODE_LOCAL = register(ClosedForm(
    name="layout.tp_groups_node_local",
    expr=sp.Piecewise((1, sp.Eq(sp.Mod(_g.symbol, _tp_s), 0)), (0, True)),
    inputs=(_tp, _g),
    unit="flag",
    source="lesson 'Scaling and distributed training', '3D parallelism': TP inside a server (NVLink); "
           "Llama 3 §3.3.2 (TP innermost)",
    description="1 if every TP group lies inside one node, i.e. tp divides gpus_per_node, when tp is the "
                "innermost axis; 0 otherwise",
    constraints=("tp is the innermost axis (the default order)",
                 "world_size is a multiple of gpus_per_node (whole nodes; a partial last node can hide a split group)"),
))

# --- a degree derived from the world size and the others

_ep_inside = Input("ep", "expert-parallel degree, carved from the dp*cp ranks (it does not change dp)", "GPUs",
                   default=1)
_tp_d = Input("tp", "tensor-parallel degree", "GPUs", default=1)
_pp_d = Input("pp", "pipeline-parallel degree", "GPUs", default=1)
_W = _world.symbol

DP_FROM_WORLD_SIZE = register(ClosedForm(
    name="layout.dp_from_world_size",
    expr=_W / (tp * cp * pp),
    inputs=(_world, _tp_d, _pp_d, _cp, _ep_inside),
    unit="GPUs",
    source="torchtitan ParallelDims (dp_shard = -1 is world_size / (dp_replicate cp tp pp)); Megatron-core "
           "initialize_model_parallel (data_parallel_size = world_size / (tp pp cp)); Narayanan et al. 2021 §3.1",
    description="data-parallel degree implied by the world size and the other degrees, ep carved out of dp "
                "(no extra GPUs): world_size / (tp cp pp)",
    constraints=("tp*cp*pp divides world_size",),
))

DP_FROM_WORLD_SIZE_EP_OUTSIDE_DP = register(ClosedForm(
    name="layout.dp_from_world_size.ep_outside_dp",
    expr=_W / (tp * cp * pp * ep),
    inputs=(_world, _ep, _tp_d, _pp_d, _cp),
    unit="GPUs",
    source="layout.world_size.ep_outside_dp solved for dp (expert parallelism as its own mesh axis)",
    description="data-parallel degree implied by the world size when ep is its own axis outside dp: "
                "world_size / (tp cp pp ep)",
    constraints=("tp*cp*pp*ep divides world_size",),
))
