"""Expert-parallel properties: the layer against the single-device MoE with the same routing, forward and
backward; token conservation; the auxiliary loss; the all-to-all bytes against the closed forms.

Implementation slots (``impl``) have the signatures of :func:`distcheck.parallel.ep.reference.ep_moe_layer`
and :func:`~distcheck.parallel.ep.reference.ep_moe_layer_backward`.

``ep.layer.forward`` (exact): every rank's output equals :func:`~distcheck.parallel.ep.reference.moe_layer`
with ``groups = ep`` bit for bit (the reference's module doc: row-local steps, choices combined in order);
the forward log's all-to-alls send ``ep.dispatch.bytes_per_rank.forward`` and
``ep.combine.bytes_per_rank.forward`` per rank (nccl-tests' all-to-all factor (ep-1)/ep).

``ep.layer.backward``: dx, dw1, dw2 bit for bit (each expert's slots summed in the stacked buffer's order,
the same in both); the router's gradient dwg sums T per-token terms ``x_t dz_t`` in another order (the
ranks' partials, then the all-reduce), so both are within ``gamma_{T-1} sum_t |x_t| |dz_t|`` of the exact sum
(Higham, "Accuracy and Stability of Numerical Algorithms", §4.2, any order) and within twice that of each
other, plus the ``(ep-1)/ep`` bytes of the backward's two all-to-alls.

``ep.tokens.conserved`` (exact): on a probe layer whose experts write a one-hot marker of their index (a
channel of ones feeds hidden unit 0; expert e's w2 maps it to column e), the nonzero markers of each token's
output are its processed choices: exactly k per token when no expert receives more than its capacity from
one rank's tokens, and otherwise exactly the choices :func:`~distcheck.parallel.ep.reference.assign_slots`
keeps (GShard's priority, per rank).

``ep.aux_loss`` (bounded): the returned loss equals Switch/GShard's ``alpha E sum f_e P_e`` on the whole batch
within ``2 gamma_{T + E + 4}`` times its value (f_e exact counts over T k, one division; P_e a sum of T
nonnegative probabilities, one division; the E products summed: all terms nonnegative, so the relative error
of each evaluation is at most gamma_{T + E + 4}).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from distcheck.core.errors import PropertyFailure
from distcheck.core.exactness import assert_bitwise_equal, assert_within, gamma
from distcheck.core.vocab import Collective, Router
from distcheck.engine.catalogue import form_value
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.ep import strategies as ds

__all__ = ["layer_forward", "layer_backward", "tokens_conserved", "aux_loss_matches"]


def _ref() -> Any:
    from distcheck.parallel.ep import reference

    return reference


def _args(case: Any) -> Any:
    r = _ref()
    return (np.split(case.x, case.ep), case.wg, r.expert_shards(case.w1, case.ep), r.expert_shards(case.w2, case.ep))


def _kw(case: Any) -> Any:
    return dict(k=case.k, capacity_factor=case.capacity_factor, router=case.router)


def _shards(got: Any, ep: Any, what: Any) -> Any:
    if not isinstance(got, (list, tuple)) or len(got) != ep:
        raise PropertyFailure(f"{what} must be one array per rank (ep={ep})", expected=ep,
                              got=len(got) if isinstance(got, (list, tuple)) else type(got).__name__)
    return np.concatenate([np.asarray(a, dtype=np.float64) for a in got])


def _check_bytes(case: Any, log: Any, phases: Any, where: Any) -> Any:
    cap = _ref().expert_capacity(case.x.shape[0] // case.ep, case.wg.shape[1], case.k, case.capacity_factor)
    shape = dict(num_experts=case.wg.shape[1], capacity=cap, h=case.x.shape[1], bytes_per_element=8, ep=case.ep)
    sent = [Fraction(case.ep - 1, case.ep) * int(np.prod(sh)) * 8 for c, sh in log if c == Collective.ALL_TO_ALL]
    want = [form_value(f"ep.{p}", **shape) for p in phases]
    if sent != want:
        forms = ", ".join(f"ep.{p}" for p in phases)
        raise PropertyFailure(f"{where}: bytes per rank of the all-to-alls ({log}) vs {forms}", expected=want, got=sent)


def layer_forward(case: Any, *, impl: Any = None, require_log: bool = True) -> None:
    """``impl`` on the case's shards: every rank's output == the single-device MoE's rows, bit for bit; the
    all-to-all bytes == the closed forms (module doc)."""
    ref = _ref()
    impl = impl or ref.ep_moe_layer
    log: list = []
    outs, _ = call_impl("ep_moe_layer", impl, *_args(case), **_kw(case), log=log)
    want, _, _ = ref.moe_layer(case.x, case.wg, case.w1, case.w2, groups=case.ep, **_kw(case))
    where = f"ep={case.ep} MoE layer (k={case.k}, capacity_factor={case.capacity_factor}, {case.router})"
    assert_bitwise_equal(want, _shards(outs, case.ep, "outputs"), what=f"{where}: output")
    if require_log:
        _check_bytes(case, log, ("dispatch.bytes_per_rank.forward", "combine.bytes_per_rank.forward"), where)


def layer_backward(case: Any, *, impl: Any = None, require_log: bool = True) -> None:
    """``impl`` (the backward): dx, dw1, dw2 == the single-device MoE's bit for bit, dwg within the derived
    bound, the backward's all-to-all bytes == the closed forms (module doc)."""
    ref = _ref()
    impl = impl or ref.ep_moe_layer_backward
    log: list = []
    got = call_impl("ep_moe_layer_backward", impl, *_args(case), np.split(case.dout, case.ep), **_kw(case), log=log)
    if not isinstance(got, (list, tuple)) or len(got) != 4:
        raise PropertyFailure("the backward must return (dx_shards, dwg, dw1_shards, dw2_shards)", expected=4, got=got)
    dx, dwg, dw1, dw2 = got
    want = ref.moe_layer_backward(case.x, case.wg, case.w1, case.w2, case.dout, groups=case.ep, **_kw(case))
    where = f"ep={case.ep} MoE backward (k={case.k}, capacity_factor={case.capacity_factor}, {case.router})"
    assert_bitwise_equal(want[0], _shards(dx, case.ep, "dx"), what=f"{where}: dx")
    assert_bitwise_equal(want[2], _shards(dw1, case.ep, "dw1"), what=f"{where}: dw1")
    assert_bitwise_equal(want[3], _shards(dw2, case.ep, "dw2"), what=f"{where}: dw2")
    T = case.x.shape[0]
    mag = _dz_magnitude(case)
    assert_within(want[1], np.asarray(dwg, dtype=np.float64), 2 * float(gamma(max(T - 1, 1))) * mag + 0.0,
                  what=f"{where}: dwg")
    if require_log:
        _check_bytes(case, log, ("combine.bytes_per_rank.backward", "dispatch.bytes_per_rank.backward"), where)


def _dz_magnitude(case: Any) -> np.ndarray:
    """``sum_t |x_t| |dz_t|`` (h, E): the magnitudes of the router gradient's terms."""
    from distcheck.parallel.ep import reference as ref

    x, wg = case.x, case.wg
    r = ref._routing(x, wg, case.k, case.capacity_factor, case.router, case.ep)
    buf = ref._buffers(x, r, wg.shape[1])
    outs = np.zeros_like(buf)
    for e in range(wg.shape[1]):
        outs[:, e] = ref.expert_mlp(buf[:, e].reshape(-1, x.shape[1]), case.w1[e], case.w2[e]).reshape(buf[:, e].shape)
    dg, _ = ref._gate_grads(case.dout, r, outs, wg.shape[1])
    return np.abs(x).T @ np.abs(ref._router_dz(x, wg, r, dg, case.router))


def probe(case: Any) -> Any:
    """The marker layer of ``ep.tokens.conserved`` for the case's routing features: ``(x, wg, w1, w2)`` with
    h' = h + E + 1 (features, E marker columns, a channel of ones whose router row is 0)."""
    T, h = case.x.shape
    E = case.wg.shape[1]
    x = np.concatenate([case.x, np.zeros((T, E)), np.ones((T, 1))], axis=1)
    wg = np.concatenate([case.wg, np.zeros((E + 1, E))])
    w1 = np.zeros((E, h + E + 1, 1))
    w1[:, -1, 0] = 1.0
    w2 = np.zeros((E, 1, h + E + 1))
    for e in range(E):
        w2[e, 0, h + e] = 1.0
    return x, wg, w1, w2


def tokens_conserved(case: Any, *, impl: Any = None) -> None:
    """On :func:`probe`'s layer: each token's processed experts (its nonzero markers) are its top-k when
    capacity allows, else exactly the choices GShard's priority keeps per rank (module doc)."""
    ref = _ref()
    impl = impl or ref.ep_moe_layer
    x, wg, w1, w2 = probe(case)
    T, h, E = case.x.shape[0], case.x.shape[1], wg.shape[1]
    outs, _ = call_impl("ep_moe_layer", impl, np.split(x, case.ep), wg, ref.expert_shards(w1, case.ep),
                        ref.expert_shards(w2, case.ep), **_kw(case), log=None)
    got = _shards(outs, case.ep, "outputs")[:, h:h + E] != 0
    experts, _, _ = ref.route(ref.rowdot(case.x, case.wg), case.k, case.router)
    n = T // case.ep
    cap = ref.expert_capacity(n, E, case.k, case.capacity_factor)
    want = np.zeros((T, E), dtype=bool)
    for g in range(case.ep):
        slots = ref.assign_slots(experts[g * n:(g + 1) * n], E, cap)
        for t, j in zip(*np.nonzero(slots >= 0), strict=True):
            want[g * n + t, experts[g * n + t, j]] = True
    roomy = all(np.bincount(experts[g * n:(g + 1) * n].ravel(), minlength=E).max() <= cap for g in range(case.ep))
    where = f"ep={case.ep}, {T} tokens, k={case.k}, capacity {cap} per expert and rank"
    if roomy and not (got.sum(axis=1) == case.k).all():
        raise PropertyFailure(f"{where}: capacity allows every choice, so every token is processed k times",
                              expected=[case.k] * T, got=got.sum(axis=1).tolist())
    if not np.array_equal(got, want):
        bad = int(np.nonzero((got != want).any(axis=1))[0][0])
        raise PropertyFailure(f"{where}: token {bad}'s processed experts (choice then token priority, per rank)",
                              expected=np.nonzero(want[bad])[0].tolist(), got=np.nonzero(got[bad])[0].tolist())


def aux_loss_matches(case: Any, *, impl: Any = None) -> None:
    """The layer's aux loss == Switch/GShard's on the whole batch within ``2 gamma_{T+E+4}`` relative."""
    ref = _ref()
    impl = impl or ref.ep_moe_layer
    _, aux = call_impl("ep_moe_layer", impl, *_args(case), **_kw(case), log=None)
    experts, _, probs = ref.route(ref.rowdot(case.x, case.wg), case.k, case.router)
    want = ref.aux_loss(probs, experts, case.wg.shape[1])
    bound = 2 * float(gamma(case.x.shape[0] + case.wg.shape[1] + 4)) * abs(want)
    try:
        value = float(aux)
    except (TypeError, ValueError) as exc:
        raise PropertyFailure("the aux loss must be a number", expected="float", got=aux) from exc
    assert_within(np.array(want), np.array(value), bound, what=f"ep={case.ep} aux loss (whole batch)")


def _edges() -> Any:
    """ep = 2 and 4 with drops (capacity factor 1/2) and without (2), both router conventions, k = 1 and 2;
    routings that differ between ranks (rank 0's tokens all to one expert); one rank."""
    rng = np.random.default_rng(3)

    def case(ep: Any, n: Any, E: Any, h: Any, f: Any, k: Any, cf: Any, router: Any, skew: Any = False) -> Any:
        x = rng.integers(-8, 9, (ep * n, h)) / 4
        wg = rng.integers(-8, 9, (h, E)) / 4
        if skew:
            x[:n] = np.abs(x[:n]) + 0.25
            wg[:, 0] = 2.0
        return ds.EPMoECase(x=x, wg=wg, w1=rng.integers(-8, 9, (E, h, f)) / 4, w2=rng.integers(-8, 9, (E, f, h)) / 4,
                            dout=rng.integers(-8, 9, (ep * n, h)) / 4, ep=ep, k=k, capacity_factor=cf, router=router)

    return (case(2, 4, 4, 2, 2, 2, 0.5, Router.TOPK_THEN_SOFTMAX, skew=True),
            case(2, 3, 4, 2, 2, 2, 2.0, Router.SOFTMAX_THEN_TOPK),
            case(4, 2, 4, 2, 2, 1, 1.0, Router.SOFTMAX_THEN_TOPK, skew=True),
            case(2, 4, 2, 2, 1, 1, 0.5, Router.TOPK_THEN_SOFTMAX, skew=True),
            case(1, 3, 2, 1, 1, 2, 1.0, Router.TOPK_THEN_SOFTMAX))


_FWD = ("ep_moe_layer(x_shards, wg, w1_shards, w2_shards, *, k, capacity_factor, router, log=None) -> "
        "(out_shards, aux_loss)")
_BWD = ("ep_moe_layer_backward(x_shards, wg, w1_shards, w2_shards, dout_shards, *, k, capacity_factor, router, "
        "log=None) -> (dx_shards, dwg, dw1_shards, dw2_shards)")

register(Property("ep.layer.forward", lambda: ds.ep_moe_cases(), layer_forward,
                  "all-to-all dispatch, experts, all-to-all combine: outputs == the single-device MoE with the same "
                  "routing, bit for bit; bytes per rank == ep.dispatch/combine.bytes_per_rank.forward", None, _FWD,
                  _edges))
register(Property("ep.layer.backward", lambda: ds.ep_moe_cases(), layer_backward,
                  "backward: dx, dw1, dw2 bit for bit, dwg within the derived bound; bytes per rank == "
                  "ep.*.bytes_per_rank.backward", None, _BWD, _edges))
register(Property("ep.tokens.conserved", lambda: ds.ep_moe_cases(), tokens_conserved,
                  "every token processed k times when capacity allows, otherwise exactly the choices GShard's "
                  "priority keeps per rank; exact", None, _FWD, _edges))
register(Property("ep.aux_loss", lambda: ds.ep_moe_cases(), aux_loss_matches,
                  "the Switch/GShard load-balancing loss over the whole batch, within the derived bound", None, _FWD,
                  _edges))
