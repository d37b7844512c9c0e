"""Closed forms for measured bandwidth and ZeRO communication in bytes (sympy only).

nccl-tests, ``doc/PERFORMANCE.md``: a collective on S bytes that takes t seconds has
*algorithm bandwidth* ``algbw = S / t``; its *bus bandwidth* ``busbw = algbw x factor``
rescales it by what each rank moves over the links, so that it can be compared with
the hardware's peak whatever n is: all-reduce ``2(n-1)/n``; all-gather, reduce-scatter
and all-to-all ``(n-1)/n``; broadcast and reduce ``1``. S is nccl-tests' size: the full
buffer (the gathered output of an all-gather, the input of a reduce-scatter).

ZeRO communication per rank in bytes (Rajbhandari et al. 2020, section 7, with the ring
factor the paper drops): DDP and stages 1 and 2 move a reduce-scatter and an all-gather
of the Psi parameters, ``2 (n-1)/n Psi b`` bytes per rank; stage 3 gathers the parameters
twice (forward and backward) and reduce-scatters the gradients, ``3 (n-1)/n Psi b``; b
is the bytes of one element (2 for bf16). ``zero.comm_elements_per_rank.*`` is the
paper's count, Psi per collective, with the factor dropped.

Registered names: ``comm.algbw``, ``comm.busbw.{all_reduce,all_gather,reduce_scatter,
all_to_all,broadcast,reduce}``, ``zero.comm_bytes_per_rank.{ddp,stage1,stage2,stage3}``.
"""

from __future__ import annotations

import sympy as sp

from distcheck.closed_form import ClosedForm, Input, register

__all__ = ["ALGBW", "BUSBW", "BUSBW_FACTORS", "ZERO_COMM_BYTES"]

_S = Input("size_bytes", "S, the collective's size in bytes (nccl-tests: the full buffer)", "bytes",
           kind="positive_integer")
_t = Input("time_s", "time of one collective, in seconds", "s", kind="positive")
_n = Input("n", "ranks taking part", "GPUs")
S, t, n = _S.symbol, _t.symbol, _n.symbol
_SRC = "nccl-tests doc/PERFORMANCE.md (algorithm bandwidth = size / time; bus bandwidth = algbw x factor)"

ALGBW = register(ClosedForm(
    name="comm.algbw",
    expr=S / t,
    inputs=(_S, _t),
    unit="bytes_per_second",
    source=_SRC,
    description="algorithm bandwidth: the collective's size S over its time t, in bytes per second",
))

#: bus-bandwidth factor of each collective (nccl-tests PERFORMANCE.md)
BUSBW_FACTORS = {
    "all_reduce": 2 * (n - 1) / n,
    "all_gather": (n - 1) / n,
    "reduce_scatter": (n - 1) / n,
    "all_to_all": (n - 1) / n,
    "broadcast": sp.Integer(1),
    "reduce": sp.Integer(1),
}

BUSBW: dict[str, ClosedForm] = {
    op: register(ClosedForm(
        name=f"comm.busbw.{op}",
        expr=S / t * factor,
        inputs=(_S, _t, _n),
        unit="bytes_per_second",
        source=_SRC,
        description=f"bus bandwidth of {op.replace('_', '-')}: algbw x {sp.sstr(factor)}, what each rank moves over "
                    "its links per second (comparable with the link's peak for any n)",
    ))
    for op, factor in BUSBW_FACTORS.items()
}

_P = Input("params", "parameter count Psi", "params")
_N = Input("n", "data-parallel ranks N_d", "GPUs")
_b = Input("bytes_per_element", "bytes of one communicated element (2 for bf16)", "bytes", default=2)
P, N, b = _P.symbol, _N.symbol, _b.symbol
_COLLECTIVES = {"ddp": 2, "stage1": 2, "stage2": 2, "stage3": 3}

ZERO_COMM_BYTES: dict[str, ClosedForm] = {
    k: register(ClosedForm(
        name=f"zero.comm_bytes_per_rank.{k}",
        expr=c * (N - 1) / N * P * b,
        inputs=(_P, _N, _b),
        unit="bytes",
        source="ZeRO paper (Rajbhandari et al. 2020) section 7 with the ring factor (n-1)/n of nccl-tests "
               "doc/PERFORMANCE.md",
        description=f"bytes each rank sends per step: {c} collectives of Psi elements (reduce-scatter and "
                    f"all-gather{'s' if c == 3 else ''}), each (n-1)/n Psi b bytes on a ring",
    ))
    for k, c in _COLLECTIVES.items()
}
