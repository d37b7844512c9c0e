"""Closed forms for the bytes each rank sends in a collective (sympy only).

Convention (nccl-tests doc/PERFORMANCE.md): ``size_bytes`` = S is the FULL
tensor (for all-gather, the concatenated output), ``n`` the ranks. The factors
are nccl-tests' bus-bandwidth factors, busbw = algbw * factor:

- ``comm.bytes_per_rank.all_reduce`` = 2(n-1)/n * S
- ``comm.bytes_per_rank.all_gather`` = (n-1)/n * S
- ``comm.bytes_per_rank.reduce_scatter`` = (n-1)/n * S
- ``comm.bytes_per_rank.all_to_all`` = (n-1)/n * S
- ``comm.bytes_per_rank.broadcast`` = S (for n >= 2; the most any rank of a
  pipelined chain sends)

A source quoting the per-rank shard s = S/n (the chapter's
"model_size/world_size" for all-gather) uses another convention: substitute
S = n*s. The numpy reference is :mod:`distcheck.parallel.comm`; not imported here.

Padded all-gather (``comm.size_bytes.all_gather_padded``): gloo's all-gather needs equal
shards, so an implementation gathering a dimension of length L that n does not divide pads
every rank's shard to ceil(L/n) slices (zeros past its own) and gathers n*ceil(L/n) slices,
then drops the padding. Its S is the padded output, n*ceil(L/n)*B for slices of B bytes;
equal to the unpadded L*B exactly when n divides L.

Measured bandwidth (nccl-tests ``doc/PERFORMANCE.md``): a collective on S bytes that
takes t seconds has *algorithm bandwidth* ``comm.algbw`` = S / t; its *bus bandwidth*
``comm.busbw.<op>`` = algbw x the same factor, what each rank moves over its links
per second, comparable with the hardware's peak for any n. nccl-tests also measures
``reduce`` (factor 1), which has a bus bandwidth here but no simulation in
:mod:`distcheck.parallel.comm`, so it is not a member of :class:`distcheck.core.vocab.Collective`.

Time of a ring collective (``comm.time_s.ring.<op>``), an alpha-beta model: the bytes each rank
sends (the factor above x S) over the bus bandwidth, plus a latency per collective and per ring
step, as NCCL's own tuning model counts them (``src/graph/tuning.cc``, ring algorithm, Simple
protocol, NCCL 2.30: a base latency of 8.4 us per collective, 3.4 us per NVLink step, 14 us per
network step; an all-reduce takes 2(n-1) steps of which 2(nodes-1) cross the network, an
all-gather or reduce-scatter n-1 of which nodes-1 do). Seconds are exact rationals.
"""

from __future__ import annotations

from fractions import Fraction

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register
from distcheck.core.vocab import Collective

__all__ = ["BYTES_PER_RANK", "ALGBW", "BUSBW", "BUSBW_FACTORS", "REDUCE", "ALL_GATHER_PADDED", "RING_TIME",
           "SEND_RECV_TIME", "NCCL_LATENCY_S"]

_S = Input("size_bytes", "S, the full tensor in bytes (nccl-tests convention)", "bytes", kind="nonnegative_integer")
_n = Input("n", "ranks taking part", "GPUs")
S, n = _S.symbol, _n.symbol

_SOURCE = "nccl-tests doc/PERFORMANCE.md (bus bandwidth factors; ring algorithms)"

_FORMS = {
    Collective.ALL_REDUCE: (
        2 * (n - 1) / n * S,
        "ring all-reduce: reduce-scatter then all-gather, each rank sends 2(n-1)/n of the full tensor", ()),
    Collective.ALL_GATHER: (
        (n - 1) / n * S,
        "ring all-gather: each rank forwards n-1 of the n shards, (n-1)/n of S = the gathered output", ()),
    Collective.REDUCE_SCATTER: (
        (n - 1) / n * S, "ring reduce-scatter: each rank sends (n-1)/n of the full input", ()),
    Collective.ALL_TO_ALL: (
        (n - 1) / n * S,
        "all-to-all: each rank sends its n-1 blocks meant for other ranks, (n-1)/n of its S-byte buffer", ()),
    Collective.BROADCAST: (
        S,
        "pipelined chain broadcast: every rank but the last forwards the whole tensor, so the most a rank sends is S",
        ("n >= 2 (a one-rank broadcast sends nothing)",)),
}

BYTES_PER_RANK: dict[Collective, ClosedForm] = {}
for _name, (_expr, _desc, _cons) in _FORMS.items():
    BYTES_PER_RANK[_name] = register(ClosedForm(
        # builds:
        #   comm.bytes_per_rank.all_gather, comm.bytes_per_rank.all_reduce, comm.bytes_per_rank.all_to_all,
        #   comm.bytes_per_rank.broadcast, comm.bytes_per_rank.reduce_scatter
        name=f"comm.bytes_per_rank.{_name}",
        expr=sp.sympify(_expr),
        inputs=(_S, _n),
        unit="bytes",
        source=_SOURCE,
        description=_desc,
        constraints=_cons,
    ))

# --- measured bandwidth: algorithm and bus bandwidth (nccl-tests doc/PERFORMANCE.md)

_S_measured = Input("size_bytes", "S, the collective's size in bytes (nccl-tests: the full buffer)", "bytes",
                    kind="positive_integer")
_t = Input("time_s", "time of one collective, in seconds", "s", kind="positive")
t = _t.symbol
_BW_SOURCE = "nccl-tests doc/PERFORMANCE.md (algorithm bandwidth = size / time; bus bandwidth = algbw x factor)"
#: nccl-tests' reduce: measured, with bus-bandwidth factor 1, but not simulated (not a Collective member)
REDUCE = "reduce"

ALGBW = register(ClosedForm(
    name="comm.algbw",
    expr=_S_measured.symbol / t,
    inputs=(_S_measured, _t),
    unit="bytes_per_second",
    source=_BW_SOURCE,
    description="algorithm bandwidth: the collective's size S over its time t, in bytes per second",
))

#: bus-bandwidth factor of each collective: the bytes a rank sends per byte of S (the forms above, divided by S)
BUSBW_FACTORS: dict[str, sp.Expr] = {
    **{op: sp.sympify(expr / S) for op, (expr, _desc, _cons) in _FORMS.items()},
    REDUCE: sp.Integer(1),
}

BUSBW: dict[str, ClosedForm] = {
    op: register(ClosedForm(
        # builds:
        #   comm.busbw.all_gather, comm.busbw.all_reduce, comm.busbw.all_to_all, comm.busbw.broadcast,
        #   comm.busbw.reduce, comm.busbw.reduce_scatter
        name=f"comm.busbw.{op}",
        expr=_S_measured.symbol / t * factor,
        inputs=(_S_measured, _t, _n),
        unit="bytes_per_second",
        source=_BW_SOURCE,
        description=f"bus bandwidth of {op.replace('_', '-')}: algbw x {sp.sstr(factor)}, what each rank moves over "
                    "its links per second (comparable with the link's peak for any n)",
    ))
    for op, factor in BUSBW_FACTORS.items()
}

# --- the padded all-gather of a dimension n does not divide (gloo needs equal shards)

_L = Input("length", "L, the length of the gathered dimension (slices along it)", "elements")
_B = Input("slice_bytes", "B, the bytes of one slice along the gathered dimension", "bytes",
           kind="nonnegative_integer")

ALL_GATHER_PADDED = register(ClosedForm(
    name="comm.size_bytes.all_gather_padded",
    expr=n * sp.ceiling(_L.symbol / n) * _B.symbol,
    inputs=(_L, _n, _B),
    unit="bytes",
    source="torch.distributed all_gather_into_tensor (equal shards; gloo refuses uneven all-gathers): each shard "
           "padded to ceil(L/n) slices",
    description="S of an all-gather of a dimension of length L over n ranks with every shard padded to ceil(L/n) "
                "slices of B bytes: n*ceil(L/n)*B (= L*B when n divides L)",
))

# --- time of a ring collective: alpha-beta, NCCL's latency model (src/graph/tuning.cc)

#: NCCL 2.30's tuning constants for the ring algorithm and the Simple protocol, in seconds (src/graph/tuning.cc:
#: baseLatencies Ring Simple 8.4 us; hwLatencies NVLINK Ring Simple 3.4 us, NET Ring Simple 14.0 us); the same
#: figures as distcheck.parallel.comm.ideal.NCCL_LATENCY_S (the planner's, without sympy; a test holds them equal)
NCCL_LATENCY_S = {"base": Fraction(84, 10**7), "intra": Fraction(34, 10**7), "inter": Fraction(14, 10**6)}

_nodes = Input("nodes", "nodes the group spans (1: inside one node)", "nodes", default=1)
_bw = Input("busbw", "bus bandwidth of the group's links, bytes per second (nccl-tests' busbw)", "bytes_per_second",
            kind="positive")
_lat = {k: Input(f"latency_{k}", desc, "s", kind="nonnegative", default=v) for k, desc, v in (
    ("base", "latency of one collective, seconds (NCCL ring, Simple: 8.4 us)", NCCL_LATENCY_S["base"]),
    ("intra", "latency of one ring step inside a node, seconds (NCCL, NVLink: 3.4 us)", NCCL_LATENCY_S["intra"]),
    ("inter", "latency of one ring step across nodes, seconds (NCCL, network: 14 us)", NCCL_LATENCY_S["inter"]))}
_nodes_s, _bw_s = _nodes.symbol, _bw.symbol
_base, _intra, _inter = (_lat[k].symbol for k in ("base", "intra", "inter"))
_NCCL = ("NCCL src/graph/tuning.cc (ring latency: base + steps x per-step latency, network steps 2(nodes-1) for "
         "all-reduce, nodes-1 otherwise); nccl-tests doc/PERFORMANCE.md (bus bandwidth); Thakur, Rabenseifner and "
         "Gropp 2005, 'Optimization of Collective Communication Operations in MPICH' (alpha-beta ring model)")

#: collective -> (ring steps, steps across nodes) on n ranks spanning `nodes` nodes
_RING_STEPS = {Collective.ALL_REDUCE: (2 * (n - 1), 2 * (_nodes_s - 1)),
               Collective.ALL_GATHER: (n - 1, _nodes_s - 1),
               Collective.REDUCE_SCATTER: (n - 1, _nodes_s - 1)}

RING_TIME: dict[Collective, ClosedForm] = {
    op: register(ClosedForm(
        # builds comm.time_s.ring.all_gather, comm.time_s.ring.all_reduce, comm.time_s.ring.reduce_scatter
        name=f"comm.time_s.ring.{op}",
        expr=_base + (steps - inter) * _intra + inter * _inter + BUSBW_FACTORS[op] * S / _bw_s,
        inputs=(_S, _n, _bw, _nodes, _lat["base"], _lat["intra"], _lat["inter"]),
        unit="seconds",
        source=_NCCL,
        description=f"seconds of a ring {op.replace('_', '-')} of S bytes on n ranks: latency_base + "
                    f"{sp.sstr(steps)} ring steps ({sp.sstr(inter)} across nodes, the rest inside) x their latency "
                    f"+ {sp.sstr(BUSBW_FACTORS[op])} S / busbw",
        constraints=("nodes <= n",),
    ))
    for op, (steps, inter) in _RING_STEPS.items()
}

_link = Input("latency_link", "latency of the one step, seconds (NCCL: 3.4 us over NVLink, 14 us over the network)",
              "s", kind="nonnegative", default=NCCL_LATENCY_S["intra"])
_p2p_bw = Input("bandwidth", "bandwidth of the link one way, bytes per second", "bytes_per_second", kind="positive")

SEND_RECV_TIME = register(ClosedForm(
    name="comm.time_s.send_recv",
    expr=_base + _link.symbol + S / _p2p_bw.symbol,
    inputs=(_S, _p2p_bw, _lat["base"], _link),
    unit="seconds",
    source=_NCCL,
    description="seconds to send S bytes to one peer (a pipeline stage's activations or gradients): latency_base + "
                "one step's latency + S / bandwidth",
))
