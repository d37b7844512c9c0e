"""The ``moe-layer`` contract: a user's mixture-of-experts layer on an expert-parallel group.

Target: a factory ``make(ctx, spec) -> layer`` called on every rank of the world (ep = world size, the default
process group). ``spec`` holds ``wg`` (h, E), the router, replicated; ``w1`` (E/ep, h, f) and ``w2`` (E/ep, f, h),
this rank's experts ``rank E/ep .. (rank+1) E/ep - 1`` (expert e is ``relu(x @ w1[e]) @ w2[e]``, no biases);
``num_experts``, ``k``, ``capacity_factor``, ``router`` (:class:`distcheck.core.vocab.Router`), ``ep``, ``rank``,
``dtype``, ``device``. ``layer(x)`` takes this rank's tokens (T/ep, h), rows ``rank T/ep ..`` of the batch, and
returns ``(out (T/ep, h), aux_loss)``; after ``out.backward(dout)`` (the aux loss's own gradient is not part of
the contract), ``layer.grads()`` returns ``{"wg": (h, E), "w1": (E/ep, h, f), "w2": (E/ep, f, h)}`` in these
layouts (None where a gradient is missing).

Reference: :mod:`distcheck.parallel.ep.reference` in float64, the single-device MoE with the same routing
(GShard's groups = the ep ranks: capacity ``ceil(k T/ep capacity_factor / E)`` per expert and rank, the slots
filled choice by choice, then in token order, Lepikhin et al. 2020, "GShard", §2.2 and Algorithm 1), with
these conventions as options:

* ``residual`` (default true): the layer returns ``x + sum_kept g_j expert_j(x)`` and a token whose choices are
  all dropped passes through unchanged; false: the sum alone (0 for such a token), as fairscale's and
  DeepSpeed's ``MOELayer`` return;
* ``renormalise`` (default false): the gates are fixed before dropping (a dropped choice's share is lost);
  true: the kept choices' gates are divided by their sum (fairscale's and DeepSpeed's ``top2gating``:
  ``gates1_s /= denom_s``), the softmax over the kept choices' logits, 0 when none is kept. Its router
  gradient is bounded for either way of computing it: through the softmax over the kept logits, or through the
  softmax over all E experts and then the division (the libraries' way), where the gradient of an expert no
  token chose is exactly 0 but rounded from terms that cancel (:func:`_renormalised_dz_magnitude`);
* ``aux_scope`` ``global`` (the loss over the whole batch, every rank the same) or ``per_rank`` (each rank's
  tokens, GShard's per-group ``l_aux``); ``aux_counts`` ``all_choices`` (``f_e`` the share of the T k choices
  routed to e, Switch Transformers eq. 5 generalised) or ``first_choice`` (the share of tokens whose top-1 is
  e, GShard Algorithm 1's ``mask1``); ``aux_scale`` ``E`` (``E sum_e f_e P_e``, Switch Transformers eq. 4) or
  ``1/E`` (``mean_e f_e P_e``, the ``torch.mean(me * ce)`` of GShard's pseudo-code);
* ``router_grad`` ``summed`` (the router's gradient summed over the ranks, the single device's) or ``local``
  (this rank's tokens' share, left to data parallelism's all-reduce as fairscale and DeepSpeed leave it);
* ``dropless`` (default false): no capacity (torchtitan's, Megatron-core's all-to-all dispatcher's and
  DeepSeek-V3's MoE): every choice reaches its expert, ``spec.capacity_factor`` is None and ``spec.dropless``
  true, and the all-to-alls carry the actual split sizes (:mod:`distcheck.parallel.ep.dropless`: the counts
  exchanged first, then ``all_to_all_single`` with ``input_split_sizes`` and ``output_split_sizes``, one row
  per choice). Zero-length splits and experts with no tokens are drawn: with 1 or 2 tokens per rank and up
  to 2 ep experts most examples have both. The case shows ``capacity_factor=inf``;
* ``capacity_factor``: a fixed factor (``"1"``), or empty to draw it from {1/2, 1, 3/2, 2};
  ``tokens_multiple_of_experts``: every rank holds a multiple of E tokens (fairscale asserts it); ``k``: a fixed
  top-k (0: drawn from 1 and 2; fairscale's ``Top2Gate`` is 2); ``local_experts``: E/ep fixed (0: drawn from 1, 2).

Cases (:func:`moe_cases`): entries multiples of 1/4, a token's logits ``±a_e + d`` with distinct integers
``a_e`` and ``|d| <= 1/4``, so no two logits of a token tie (top-k is the same in any implementation) and
logits, expert inputs and outputs are exact in float32 and float64; only the gates (exp, a sum, a division)
are rounded. bfloat16 is not offered: an expert's output needs more than its 8 significant bits.

Properties:

* ``forward`` (bounded), ``grads`` (bounded: dx, dw1, dw2 and dwg of ``sum(out * dout)``): each value is a sum
  of products of exact numbers with at most two rounded gates (the softmax's backward ``g_j (dg_j - sum g_i
  dg_i)`` has two), each within ``eps = gamma_{2E+8}`` of its exact value (exp within one ulp, 2u; a sum of at
  most E terms; a division; the renormalisation's sum and division), summed in sums of at most
  ``N = T + E + h + f + 2k + 8`` terms in any order. So ``|got - exact| <= ((1+eps)^2 (1+u)^N - 1) M <=
  3 (eps + gamma_N) M`` entrywise (Higham, "Accuracy and Stability of Numerical Algorithms", Lemma 3.3 and
  §3.1), with ``M`` the same computation on absolute values (the reference run on |x|, |w1|, |w2|, |dout|, the
  routing's slots and the gates, which only widens relu's mask). Under ``renormalise`` M also holds the router
  gradient's terms through the softmax over all experts (the ``renormalise`` option above), whose products carry
  up to four rounded factors (two probabilities, a gate, the division by the kept sum): ``(1+eps)^4 (1+u)^N - 1
  <= 3 (eps + gamma_N)`` still holds, as ``2E + 8 <= 3N``. The bound at the dtype's unit roundoff plus the
  reference's own at 2^-53.
* ``tokens`` (exact): a token the reference drops entirely (every choice over its expert's capacity on its
  rank) gets exactly the pass-through (x, or 0 without the residual), bit for bit; a token with a kept choice
  whose contribution exceeds the forward bound does not.
* ``aux_loss`` (bounded): the returned loss equals the option's formula (nonnegative terms: within
  ``3 (eps + gamma_N) aux``).
* ``all_to_all.forward``, ``all_to_all.backward`` (exact): each rank issues exactly two all-to-alls in the
  forward (dispatch, combine) and two in the backward, each of its (E, C, h) buffer: S = E C h B bytes, the
  bytes sent ``(ep-1)/ep S`` being the closed forms ``ep.dispatch.bytes_per_rank.*`` and
  ``ep.combine.bytes_per_rank.*``. Other collectives (an aux loss's all-reduce) are not counted here.
  Under ``dropless``: the floating-point all-to-alls of each phase are exactly a dispatch and a combine at the
  split sizes the routing gives (:func:`distcheck.parallel.ep.dropless.check_splits`), bytes sent to and
  received from each rank; the integer count exchange is not part of the rows.

A failure of ``forward``, ``grads`` or ``aux_loss`` whose values are what another named convention gives
(within the same bound) says so, with the option that certifies it (:mod:`distcheck.parallel.ep.conventions`):
``matches convention renormalise=true (GShard top-2, ...): certify with --option renormalise=true``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from distcheck.core.errors import ConfigError
from distcheck.core.exactness import unit_roundoff
from distcheck.core.vocab import Collective, Router, names
from distcheck.engine.contracts.checks import agree, combine, compare, compare_collectives
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, check_call_shape, make_target, resolve
from distcheck.engine.world import RankContext
from distcheck.parallel.ep.strategies import EPMoECase

_DROPLESS_FACTOR = math.inf  # the case's capacity_factor under dropless: no capacity

__all__ = ["MoELayerContract", "moe_cases", "expected", "numeric", "AUX_SCOPES", "AUX_COUNTS", "AUX_SCALES",
           "ROUTER_GRADS"]

#: the aux loss over the whole batch (every rank the same) or each rank's tokens
AUX_SCOPES = ("global", "per_rank")
#: ``f_e`` over all T k choices, or over the tokens' first choices
AUX_COUNTS = ("all_choices", "first_choice")
#: ``E sum f P`` (Switch eq. 4) or ``mean f P`` (GShard's pseudo-code)
AUX_SCALES = ("E", "1/E")
#: the router's gradient summed over the ranks, or this rank's share
ROUTER_GRADS = ("summed", "local")
_FACTORS = (0.5, 1.0, 1.5, 2.0)
ITEMSIZE = {"float64": 8, "float32": 4}


def moe_cases(ep: int, *, capacity_factor: float | None = None, tokens_multiple_of_experts: bool = False,
              max_local_experts: int = 2, k: int = 0, local_experts: int = 0,
              dropless: bool = False) -> SearchStrategy[EPMoECase]:
    """:class:`~distcheck.parallel.ep.strategies.EPMoECase` examples on ``ep`` ranks with tie-free logits (module
    doc): h, f in 1..2, 1 or 2 tokens per rank (or 1 or 2 multiples of E), E = ep * (1 .. max_local_experts), top-k
    with k drawn from 1..2 (``k`` > 0: that k, E at least k); ``local_experts`` > 0 fixes E/ep. ``dropless``:
    no capacity (the case's factor is inf)."""

    @st.composite
    def draw(d: Any) -> EPMoECase:
        least = max(1, -(-k // ep))
        E = ep * (max(local_experts, least) if local_experts else d(st.integers(least, max(max_local_experts, least))))
        n = E * d(st.integers(1, 2)) if tokens_multiple_of_experts else d(st.integers(1, 2))
        h, f = d(st.integers(1, 2)), d(st.integers(1, 2))
        kk = k if k > 0 else d(st.integers(1, min(2, E)))
        T = ep * n

        def q(shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
            size = math.prod(shape)
            return np.array(d(st.lists(st.integers(lo, hi), min_size=size, max_size=size)),
                            dtype=np.float64).reshape(shape) / 4

        sign = np.array(d(st.lists(st.sampled_from([-1.0, 1.0]), min_size=T, max_size=T)))
        x = np.concatenate([sign[:, None], q((T, h - 1), -4, 4)], axis=1)
        first = np.array(d(st.permutations(list(range(E)))), dtype=np.float64)
        wg = np.concatenate([first[None], q((h - 1, E), -1, 1) / 2], axis=0)   # |rest| <= (h-1) 1/8 <= 1/8
        if dropless:
            cf = _DROPLESS_FACTOR
        else:
            cf = capacity_factor if capacity_factor is not None else d(st.sampled_from(_FACTORS))
        router = d(st.sampled_from(names(Router)))
        return EPMoECase(x=x, wg=wg, w1=q((E, h, f), -8, 8), w2=q((E, f, h), -8, 8), dout=q((T, h), -8, 8), ep=ep,
                         k=kk, capacity_factor=cf, router=router)

    return draw()


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def expected(case: EPMoECase, options: dict, *, magnitude: bool = False) -> dict[str, Any]:
    """The reference's results under ``options`` (module doc): ``out`` (T, h), ``aux`` (per rank), ``dx`` (T, h),
    ``dw1``, ``dw2`` (E, ...), ``dwg`` (per rank: the summed or the local gradient), ``dropped`` (T,) booleans.
    ``magnitude``: the same computation on absolute values (the bound's M)."""
    from distcheck.parallel.ep import reference as ref

    x, wg, w1, w2, dout = case.x, case.wg, case.w1, case.w2, case.dout
    E, h, T, ep = wg.shape[1], x.shape[1], x.shape[0], case.ep
    n = T // ep
    # dropless: capacity n per expert and rank (a token picks k distinct experts), so no choice is dropped
    factor = Fraction(E, case.k) if options.get("dropless") else case.capacity_factor
    r = ref._routing(x, wg, case.k, factor, case.router, ep)
    router = case.router
    kept_sum = np.ones((T, 1))
    if options["renormalise"]:
        kept_sum = np.sum(np.where(r.kept, r.gates, 0.0), axis=1, keepdims=True)
        gates = np.where(r.kept, r.gates / np.where(kept_sum > 0, kept_sum, 1.0), 0.0)
        r, router = replace(r, gates=gates), Router.TOPK_THEN_SOFTMAX
    if magnitude:
        x, wg, w1, w2, dout = (np.abs(a) for a in (x, wg, w1, w2, dout))
    base = x if options["residual"] else np.zeros_like(x)
    buf = ref._buffers(x, r, E)
    outs = np.zeros_like(buf)
    for e in range(E):
        outs[:, e] = ref.expert_mlp(buf[:, e].reshape(-1, h), w1[e], w2[e]).reshape(ep, r.capacity, h)
    out = ref._combine(base, r, outs)
    dg, dy = ref._gate_grads(dout, r, outs, E)
    dxs, dw1, dw2 = np.zeros_like(buf), np.zeros_like(w1), np.zeros_like(w2)
    for e in range(E):
        got, dw1[e], dw2[e] = ref._expert_backward(buf[:, e].reshape(-1, h), w1[e], w2[e], dy[:, e].reshape(-1, h))
        dxs[:, e] = got.reshape(ep, r.capacity, h)
    if magnitude:
        dz = _dz_magnitude(r, dg, router, E)
        if options["renormalise"]:
            dz = dz + _renormalised_dz_magnitude(r, dg, kept_sum)
    else:
        dz = ref._router_dz(x, wg, r, dg, router)
    dx = ref._token_dx(dout if options["residual"] else np.zeros_like(dout), r, dxs) + ref.rowdot(dz, wg.T)
    partial = [ref.rowdot(x[i * n:(i + 1) * n].T, dz[i * n:(i + 1) * n]) for i in range(ep)]
    total = partial[0]
    for p in partial[1:]:
        total = total + p
    dwg = partial if options["router_grad"] == "local" else [total] * ep
    return {"out": out, "dx": dx, "dw1": dw1, "dw2": dw2, "dwg": dwg, "aux": _aux(r, options, ep, E),
            "dropped": ~r.kept.any(axis=1), "contribution": out - base, "capacity": r.capacity,
            "experts": r.experts}


def _dz_magnitude(r: Any, dg: np.ndarray, router: str, E: int) -> np.ndarray:
    """``|dz|`` bounded entrywise: ``p_e (|dp_e| + sum_i p_i |dp_i|)`` (dg is already a magnitude)."""
    if router == Router.SOFTMAX_THEN_TOPK:
        dp = np.zeros(r.probs.shape)
        np.put_along_axis(dp, r.experts, dg, axis=1)
        return r.probs * (dp + np.sum(r.probs * dp, axis=1, keepdims=True))
    dzk = r.gates * (dg + np.sum(r.gates * dg, axis=1, keepdims=True))
    dz = np.zeros(r.probs.shape)
    np.put_along_axis(dz, r.experts, dzk, axis=1)
    return dz


def _renormalised_dz_magnitude(r: Any, dg: np.ndarray, kept_sum: np.ndarray) -> np.ndarray:
    """``|dz|`` bounded entrywise for renormalised gates differentiated through the softmax over all E experts
    (DeepSpeed's and fairscale's ``top2gating``: ``g_i = p_i / S``, S the kept probabilities' sum):
    ``dp_i = (dg_i - sum_l g_l dg_l) / S`` at a kept choice, 0 elsewhere, then ``p_e (dp_e - sum_i p_i dp_i)``.
    The inner sum is exactly 0, so an expert no token chose has an exact gradient of 0, but its rounded value is
    not: bounded with ``|dp_i| <= (|dg_i| + sum_l g_l |dg_l|) / S`` by ``p_e (|dp_e| + sum_i p_i |dp_i|)``
    (``dg`` and ``r.gates`` the renormalised gates' magnitudes)."""
    s = np.where(kept_sum > 0, kept_sum, 1.0)
    dpk = np.where(r.kept, (dg + np.sum(r.gates * dg, axis=1, keepdims=True)) / s, 0.0)
    dp = np.zeros(r.probs.shape)
    np.put_along_axis(dp, r.experts, dpk, axis=1)
    return r.probs * (dp + np.sum(r.probs * dp, axis=1, keepdims=True))


def _aux(r: Any, options: dict, ep: int, E: int) -> list[float]:
    T = r.experts.shape[0]
    n = T // ep
    spans = [(0, T)] * ep if options["aux_scope"] == "global" else [(i * n, (i + 1) * n) for i in range(ep)]
    scale = float(E) if options["aux_scale"] == "E" else 1.0 / E
    got = []
    for lo, hi in spans:
        chosen = r.experts[lo:hi] if options["aux_counts"] == "all_choices" else r.experts[lo:hi, :1]
        f = np.bincount(chosen.ravel(), minlength=E).astype(np.float64) / chosen.size
        P = r.probs[lo:hi].sum(axis=0) / (hi - lo)
        got.append(float(scale * np.sum(f * P)))
    return got


class MoELayerContract(Contract):
    """An MoE layer on an expert-parallel group (see the module doc)."""

    name = "moe-layer"
    parallelism = "ep"
    min_world_size = 2
    min_world_reason = ("one rank holds every expert and the whole batch: no all-to-all moves a token, so a "
                        "dispatch to the wrong rank, a permuted combine or capacity over the global batch instead "
                        "of per rank is the right answer there")
    summary = ("top-k routing, capacity, dispatch and combine by all-to-all: the single-device MoE's output, "
               "gradients, dropped tokens and aux loss, and the all-to-alls' bytes")
    dtypes = ("float64", "float32")
    properties = (
        PropertySpec("forward", "every rank's output equals the single-device MoE's with the same routing at its "
                                "tokens, within the derived bound", "bounded"),
        PropertySpec("grads", "dx, this rank's experts' dw1 and dw2 and the router's dwg equal the single-device "
                              "MoE's, within the derived bounds", "bounded"),
        PropertySpec("tokens", "exactly the tokens the reference drops (every choice over capacity) pass through "
                               "unchanged, bit for bit; the others do not", "exact"),
        PropertySpec("aux_loss", "the returned auxiliary loss equals the named convention's, within the derived "
                                 "bound", "bounded"),
        PropertySpec("all_to_all.forward", "two all-to-alls of the (E, C, h) buffer per rank (dispatch, combine), "
                                           "the bytes of ep.dispatch/combine.bytes_per_rank.forward", "exact"),
        PropertySpec("all_to_all.backward", "two all-to-alls of the (E, C, h) buffer per rank, the bytes of "
                                            "ep.dispatch/combine.bytes_per_rank.backward", "exact"),
    )
    options = (
        Option("residual", True, bool, "the layer returns x + the experts' combine (false: the combine alone)"),
        Option("renormalise", False, bool, "the kept choices' gates divided by their sum after dropping"),
        Option("aux_scope", "global", str, "the aux loss over the whole batch or each rank's tokens", AUX_SCOPES),
        Option("aux_counts", "all_choices", str, "f_e over all T k choices or the tokens' first choices", AUX_COUNTS),
        Option("aux_scale", "E", str, "E sum_e f_e P_e (Switch eq. 4) or mean_e f_e P_e", AUX_SCALES),
        Option("router_grad", "summed", str, "the router's gradient summed over the ranks or this rank's share",
               ROUTER_GRADS),
        Option("dropless", False, bool, "no capacity: every choice kept, all-to-alls of the actual split sizes "
                                        "(counts exchanged first)"),
        Option("capacity_factor", "", str, "a fixed capacity factor (empty: drawn from 0.5, 1, 1.5, 2)"),
        Option("tokens_multiple_of_experts", False, bool, "every rank holds a multiple of E tokens"),
        Option("k", 0, int, "a fixed top-k (0: drawn from 1 and 2)", min_value=0, max_value=2),
        Option("local_experts", 0, int, "experts per rank, fixed (0: drawn from 1 and 2)", min_value=0, max_value=4),
    )

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        shown = ref or repr(obj)
        if not callable(obj) or isinstance(obj, type):
            raise ProtocolError("target", shown, f"must be a factory make(ctx, spec) -> layer for contract {self.name}")
        check_call_shape(obj, shown, "must take (ctx, spec): the rank and its router, experts and settings")
        factor = _factor(options)
        if options["dropless"] and factor is not None:
            raise ConfigError("option capacity_factor", options["capacity_factor"],
                              "must be empty under dropless=true (a dropless layer has no capacity)")
        if options["dropless"] and options["tokens_multiple_of_experts"]:
            raise ConfigError("option tokens_multiple_of_experts", True,
                              "must be false under dropless=true (it sizes capacity buffers; there are none)")
        return make_target(obj, ref, "factory"), options

    def cases(self, world_size: int, dtype: str, options: dict) -> SearchStrategy[EPMoECase]:
        return moe_cases(world_size, capacity_factor=_factor(options),
                         tokens_multiple_of_experts=bool(options["tokens_multiple_of_experts"]), k=int(options["k"]),
                         local_experts=int(options["local_experts"]), dropless=bool(options["dropless"]))

    def statement(self, prop: str, dtype: str, options: dict) -> str:
        """The property's statement; under ``dropless`` the tokens and all-to-all properties' own."""
        if options.get("dropless") and prop in _DROPLESS_STATEMENTS:
            return _DROPLESS_STATEMENTS[prop]
        return self.spec(prop).statement

    def run_rank(self, ctx: RankContext, target: Target, case: EPMoECase, dtype: str, options: dict) -> dict:
        import torch

        from distcheck.engine.collectives import ByteCounter
        from distcheck.engine.contracts.layer import torch_dtype
        from distcheck.parallel.ep.dropless import split_recorder

        dt = torch_dtype(dtype)
        E, T = case.wg.shape[1], case.x.shape[0]
        n, m = T // case.ep, E // case.ep
        lo, hi = ctx.rank * n, (ctx.rank + 1) * n

        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dt, device=ctx.device)

        dropless = bool(options["dropless"])
        spec = SimpleNamespace(wg=tensor(case.wg), w1=tensor(case.w1[ctx.rank * m:(ctx.rank + 1) * m]),
                               w2=tensor(case.w2[ctx.rank * m:(ctx.rank + 1) * m]), num_experts=E, k=case.k,
                               capacity_factor=None if dropless else case.capacity_factor, router=case.router,
                               ep=case.ep, rank=ctx.rank, dtype=dt, device=ctx.device, dropless=dropless)
        layer = resolve(target)(ctx, spec)
        x = tensor(case.x[lo:hi]).requires_grad_(True)
        splits = {"forward": split_recorder(case.ep), "backward": split_recorder(case.ep)}
        with ByteCounter() as forward, splits["forward"]:
            got = layer(x)
        if not isinstance(got, (tuple, list)) or len(got) < 2:
            raise ProtocolError("target", target.ref, "layer(x) must return (out, aux_loss)")
        out, aux = got[0], got[1]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(x.shape):
            raise AssertionError(f"{target.ref}: the output must be this rank's tokens, shape {tuple(x.shape)}; got "
                                 f"{getattr(out, 'shape', type(out).__name__)}")
        with ByteCounter() as backward, splits["backward"]:
            torch.autograd.backward(out, tensor(case.dout[lo:hi]))
        grads = layer.grads()

        def back(t: Any) -> np.ndarray | None:
            return None if t is None else t.detach().to(torch.float64).cpu().numpy()

        def kind(t: Any) -> str | None:
            return None if t is None else str(t.dtype).removeprefix("torch.")

        keys = ("wg", "w1", "w2")
        aux = aux.detach() if isinstance(aux, torch.Tensor) else aux  # read, not differentiated: no UserWarning
        return {"out": back(out), "dx": back(x.grad), "aux": float(aux), "grads": {g: back(grads.get(g)) for g in keys},
                "dtypes": {"out": kind(out), "dx": kind(x.grad), **{g: kind(grads.get(g)) for g in keys}},
                "forward": list(forward.records), "backward": list(backward.records),
                "splits": {phase: list(rec.records) for phase, rec in splits.items()}}

    def check(self, case: EPMoECase, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        got, eta, ref, mag = numeric(case, results, dtype, options)
        out = dict(got)
        failing = [p for p in out if not out[p].ok]
        if failing:
            from distcheck.parallel.ep.conventions import hint

            for p, text in hint(failing, options, lambda alt: numeric(case, results, dtype, alt)[0]).items():
                o = out[p]
                out[p] = Outcome(False, max_error=o.max_error, bound=o.bound, message=f"{o.message}; {text}",
                                 ranks=o.ranks)
        out["tokens"] = _tokens(case, ref, eta * mag["out"], results, bool(options["residual"]))
        if options["dropless"]:
            out.update(_dropless_all_to_alls(case, ref["experts"], dtype, results))
        else:
            out.update(_all_to_alls(case, ref["capacity"], dtype, results))
        return out


def numeric(case: EPMoECase, results: list, dtype: str,
            options: dict) -> tuple[dict[str, Outcome], float, dict[str, Any], dict[str, Any]]:
    """``({"forward", "grads", "aux_loss"}: outcomes, eta, the reference, its magnitudes)``: the ranks' values
    against the reference (:func:`expected`) under ``options``, within the bound eta times the magnitudes (module
    doc)."""
    want, mag = expected(case, options), expected(case, options, magnitude=True)
    E, T, h = case.wg.shape[1], case.x.shape[0], case.x.shape[1]
    f, ep, k = case.w1.shape[2], case.ep, case.k
    N = T + E + h + f + 2 * k + 8
    eta = sum(3 * (_gamma(2 * E + 8, u) + _gamma(N, u)) for u in (float(unit_roundoff(dtype)), 2.0**-53))
    n, m = T // ep, E // ep
    rows = [slice(r * n, (r + 1) * n) for r in range(ep)]
    mine = [slice(r * m, (r + 1) * m) for r in range(ep)]

    def one(what: str, key: str, exp: list, bound: list) -> Outcome:
        got = [res[key] if key in ("out", "dx") else res["grads"][key] for res in results]
        return compare(what, dtype, exp, got, [res["dtypes"][key] for res in results], bound)

    forward = one("output", "out", [want["out"][s] for s in rows], [eta * mag["out"][s] for s in rows])
    grads = [one("input gradient", "dx", [want["dx"][s] for s in rows], [eta * mag["dx"][s] for s in rows])]
    for key in ("w1", "w2"):
        grads.append(one(f"gradient of {key}", key, [want["d" + key][s] for s in mine],
                         [eta * mag["d" + key][s] for s in mine]))
    grads.append(one("gradient of wg", "wg", want["dwg"], [eta * a for a in mag["dwg"]]))
    if options["router_grad"] == "summed":
        grads.append(agree("gradient of wg", [res["grads"]["wg"] for res in results]))
    mine_aux = [np.array([res["aux"]]) for res in results]
    aux = compare("aux loss", dtype, [np.array([a]) for a in want["aux"]], mine_aux, [dtype] * ep,
                  [np.array([eta * a]) for a in mag["aux"]])
    if options["aux_scope"] == "global":
        aux = combine(aux, agree("aux loss", mine_aux))
    return {"forward": forward, "grads": combine(*grads), "aux_loss": aux}, eta, want, mag


def _factor(options: dict) -> float | None:
    text = str(options["capacity_factor"]).strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError("option capacity_factor", text, "must be a number > 0 or empty (drawn)") from None
    if not value > 0 or not math.isfinite(value):
        raise ConfigError("option capacity_factor", text, "must be a number > 0 or empty (drawn)")
    return value


def _tokens(case: EPMoECase, want: dict, bound: np.ndarray, results: list, residual: bool) -> Outcome:
    T, ep = case.x.shape[0], case.ep
    n = T // ep
    passthrough = case.x if residual else np.zeros_like(case.x)
    bad, ranks = [], []
    for t in range(T):
        got = results[t // n]["out"][t % n]
        same = bool(np.array_equal(got, passthrough[t]))
        if want["dropped"][t] and not same:
            bad.append(f"token {t} (rank {t // n}) has every choice over capacity {want['capacity']} and must pass "
                       f"through as {passthrough[t].tolist()}, got {got.tolist()}")
            ranks.append(t // n)
        elif not want["dropped"][t] and same and np.any(np.abs(want["contribution"][t]) > 2 * bound[t]):
            bad.append(f"token {t} (rank {t // n}) has a kept choice contributing {want['contribution'][t].tolist()} "
                       f"but passed through as {got.tolist()} (dropped)")
            ranks.append(t // n)
    if not bad:
        return Outcome(True, max_error=0.0, bound=0.0)
    return Outcome(False, bound=0.0, message="; ".join(bad), ranks=tuple(sorted(set(ranks))))


def _all_to_alls(case: EPMoECase, capacity: int, dtype: str, results: list) -> dict[str, Outcome]:
    from distcheck.engine.catalogue import get

    E, h, ep = case.wg.shape[1], case.x.shape[1], case.ep
    values = {"num_experts": E, "capacity": capacity, "h": h, "bytes_per_element": ITEMSIZE[dtype], "ep": ep}
    got = {}
    for phase in ("forward", "backward"):
        forms = [f"ep.dispatch.bytes_per_rank.{phase}", f"ep.combine.bytes_per_rank.{phase}"]
        sent = [int(get(name).evaluate(**values)) for name in forms]
        want = [(Collective.ALL_TO_ALL, s * ep // (ep - 1)) for s in sent]   # S = the buffer: sent = (ep-1)/ep S
        src = (f"closed forms {forms[0]} = {sent[0]} B and {forms[1]} = {sent[1]} B sent per rank, the (E, C, h) = "
               f"({E}, {capacity}, {h}) buffer less the block a rank keeps")
        mine = [[rec for rec in res[phase] if rec[0] == Collective.ALL_TO_ALL] for res in results]
        got[f"all_to_all.{phase}"] = compare_collectives(phase, want, mine, src)
    return got


def _dropless_all_to_alls(case: EPMoECase, experts: np.ndarray, dtype: str, results: list) -> dict[str, Outcome]:
    from distcheck.parallel.ep.dropless import check_splits, expected_splits

    a, b = expected_splits(experts, case.ep, case.wg.shape[1])
    row = case.x.shape[1] * ITEMSIZE[dtype]
    return {f"all_to_all.{phase}": check_splits(phase, a, b, row, [res["splits"][phase] for res in results])
            for phase in ("forward", "backward")}


#: the statements of the properties whose claim changes under ``dropless``
_DROPLESS_STATEMENTS = {
    "tokens": "no capacity: no token passes through unchanged, every choice reaches its expert (token "
              "conservation)",
    "all_to_all.forward": "two floating-point all_to_all_single per rank (dispatch, combine) of the actual split "
                          "sizes, one row of h elements per choice: the bytes sent to and received from each rank",
    "all_to_all.backward": "two floating-point all_to_all_single per rank, the forward's split sizes swapped",
}
