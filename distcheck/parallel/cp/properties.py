"""Context-parallel properties: each variant against full attention, forward and backward; the
online-softmax merge; load balancing.

Implementation slots (``impl``) have the signatures of :mod:`distcheck.parallel.cp.variants` and
:mod:`distcheck.parallel.cp.reference`, listed per property.

The bound of ``cp.<variant>.attention`` (bounded). Both the variant and full attention (tensor
parallelism's single-device reference) are computed in float64 (u = 2^-53); the model is Higham's,
"Accuracy and Stability of Numerical Algorithms", §3.1 and Lemma 3.1 (each operation rounds with
relative error at most u, exp within 2u, a sum of n terms within gamma_n of its magnitudes). With
``M_q, M_k, M_v, M_do`` the largest entries, e the head dimension, s the sequence length, g the GQA group:

1. a score ``q.k / sqrt(e)`` is within ``delta = gamma_{e+2} e M_q M_k / sqrt(e)`` of its exact value,
   and a score minus its row max (over any block) is at most ``R = 2 e M_q M_k / sqrt(e)`` in magnitude;
2. a weight ``exp(s_j - m)``, rescaled by at most cp merge factors ``exp(m_i - m)``, is within the relative
   error ``expm1(2 delta + 4 u R) + gamma_{4 cp + 4}`` of ``exp(s_j - lse)`` times the exact normaliser;
3. the output ``acc / l`` and the gradients are sums of at most ``2 s + 2 e`` such terms, so with
   ``eps = 4 (expm1(2 delta + 4 u R) + gamma_{2 s + 2 e + 8 cp + 16})`` (a factor 2 for the two computations
   compared, 2 for the first-order terms' slack) every entry is within ``eps`` times its magnitude:
   output ``M_v``; dv ``g s M_do``; dq ``2 e M_do M_v M_k / sqrt(e)``; dk ``2 g s e M_do M_v M_q / sqrt(e)``
   (``|dS_ij| <= P_ij 2 e M_do M_v``, and P sums to 1 over a row).

On the drawn cases (entries multiples of 1/4 in [-2, 2]) the bound is about 10^-13; a missed block, a
mask on local positions or an unsummed gradient moves an entry by 10^-2 or more.

``cp.merge.online_softmax``: ``impl(a, b)`` is commutative bit for bit; merging the blocks' partials
in the drawn order (a left fold) and as a balanced tree gives, after ``finalize``, the single-block
result within ``8 (expm1(2 u R) + gamma_{n_k + 2 n_blocks + 8}) max|v|`` (R the row's score range), and
on exact cases (scores M or -inf) every order gives ``m = M``, ``l`` = the count and ``acc`` = the sum of
the values read, bit for bit (``exp(0) = 1``; the sums of multiples of 1/4 are exact).

``cp.balance.equal_work``: every rank holds 2 chunks' worth of positions, the ranks' positions partition
0 .. s-1, and every rank's causal work equals ``cp.causal_work.balanced`` exactly (an integer count).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError, ImplementationError, PropertyFailure
from distcheck.core.exactness import assert_bitwise_equal, assert_within, gamma, to_exact
from distcheck.core.vocab import ContextParallel
from distcheck.engine.catalogue import form_value
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.cp import strategies as ds

__all__ = ["attention_matches", "ring_attention", "all_gather_attention", "ulysses_attention", "merge_online_softmax",
           "balance_equal_work"]

U = 2.0**-53


def _ref() -> ModuleType:
    from distcheck.parallel.cp import reference

    return reference


def _variants() -> ModuleType:
    from distcheck.parallel.cp import variants

    return variants


def _positions(case: ds.CPAttentionCase) -> list[np.ndarray]:
    r = _ref()
    return (r.load_balanced_positions if case.balanced else r.contiguous_positions)(case.q.shape[0], case.cp)


def _g(k: int) -> float:
    return float(gamma(k))


def _eps(case: ds.CPAttentionCase) -> float:
    s, H, e = case.q.shape
    mq, mk = float(np.abs(case.q).max(initial=0)), float(np.abs(case.k).max(initial=0))
    delta = _g(e + 2) * e * mq * mk / math.sqrt(e)
    R = 2 * e * mq * mk / math.sqrt(e)
    return 4 * (math.expm1(2 * delta + 4 * U * R) + _g(2 * s + 2 * e + 8 * case.cp + 16))


def _unshard(shards: Any, positions: Sequence[np.ndarray], what: str, s: int) -> np.ndarray | None:
    if not isinstance(shards, (list, tuple)) or len(shards) != len(positions):
        raise PropertyFailure(f"{what} must be one shard per rank (cp={len(positions)})", expected=len(positions),
                              got=type(shards).__name__ if not isinstance(shards, (list, tuple)) else len(shards))
    out = None
    for r, (a, p) in enumerate(zip(shards, positions, strict=True)):
        a = np.asarray(a, dtype=np.float64)
        if a.shape[0] != len(p):
            raise PropertyFailure(f"{what}: rank {r}'s shard has {a.shape[0]} tokens, its positions {len(p)}",
                                  expected=len(p), got=a.shape[0])
        if out is None:
            out = np.zeros((s,) + a.shape[1:])
        out[p] = a
    return out


def attention_matches(case: ds.CPAttentionCase, variant: str, *, impl: Callable[..., Any] | None = None,
                      require_log: bool = True) -> None:
    """``impl`` (a ``*_step`` of :mod:`~distcheck.parallel.cp.variants`) on the case's shards: outputs and
    ``(dq, dk, dv)`` reassembled by position equal full attention's within the derived bound (module doc);
    the bytes per rank of its forward ``log`` and backward ``grad_log`` equal ``cp.<variant>.bytes_per_rank.*``.
    For Ulysses with cp not dividing the heads, ``impl`` must raise ConfigError."""
    ref, var = _ref(), _variants()
    impl = impl or getattr(var, f"{variant}_step")
    positions = _positions(case)
    q, k, v, do = (ref.shard(a, positions) for a in (case.q, case.k, case.v, case.dout))
    s, H, e = case.q.shape
    Hkv = case.k.shape[1]
    log: list = []
    grad_log: list = []
    if variant == ContextParallel.ULYSSES and (H % case.cp or Hkv % case.cp):
        try:
            impl(q, k, v, do, positions, causal=case.causal, log=log, grad_log=grad_log)
        except ConfigError:
            return
        except Exception as exc:
            raise ImplementationError(f"implementation {variant}_step raised {type(exc).__name__}: {exc} (expected "
                                      "ConfigError)", "raised", type(exc).__name__) from exc
        raise PropertyFailure(f"Ulysses accepted cp={case.cp} with num_heads={H}, num_kv_heads={Hkv}: each rank "
                              "must take whole heads (cp.ulysses.heads_per_rank, cp.ulysses.kv_heads_per_rank)",
                              expected="ConfigError", got="a result")
    outs, grads = call_impl(f"{variant}_step", impl, q, k, v, do, positions, causal=case.causal, log=log,
                            grad_log=grad_log)
    eps = _eps(case)
    g = H // Hkv
    mq, mk, mv, mdo = (float(np.abs(a).max(initial=0)) for a in (case.q, case.k, case.v, case.dout))
    root = math.sqrt(e)
    expected = ref.full_attention(case.q, case.k, case.v, case.causal)
    where = f"{variant} attention (cp={case.cp}, {'head-tail' if case.balanced else 'contiguous'} shards)"
    assert_within(expected, _unshard(outs, positions, "outputs", s), eps * mv + 0.0, what=f"{where}: output")
    if not isinstance(grads, (list, tuple)) or len(grads) != 3:
        raise PropertyFailure(f"{where}: the backward must return (dq, dk, dv) shards", expected=3, got=grads)
    want = ref.full_attention_backward(case.q, case.k, case.v, case.dout, case.causal)
    mags = (2 * e * mdo * mv * mk / root, 2 * g * s * e * mdo * mv * mq / root, g * s * mdo)
    for name, got, exp, mag in zip(("dq", "dk", "dv"), grads, want, mags, strict=True):
        assert_within(exp, _unshard(got, positions, name, s), eps * mag + 0.0, what=f"{where}: {name}")
    if not require_log:
        return
    shape = dict(s=s, b=1, num_heads=H, num_kv_heads=Hkv, head_dim=e, bytes_per_element=8, cp=case.cp)
    if variant != ContextParallel.ULYSSES:
        shape = {n: shape[n] for n in ("s", "b", "num_kv_heads", "head_dim", "bytes_per_element", "cp")}
    for phase, got_log in (("forward", log), ("backward", grad_log)):
        sent = var.sent_bytes(got_log, case.cp)
        form = (0 if variant == ContextParallel.RING and phase == "backward" and case.cp == 1
                else form_value(f"cp.{variant}.bytes_per_rank.{phase}", **shape))
        if Fraction(sent) != Fraction(form):
            raise PropertyFailure(f"{where}: bytes per rank of the {phase} ({got_log}) vs "
                                  f"cp.{variant}.bytes_per_rank.{phase}", expected=form, got=sent)


def ring_attention(case: ds.CPAttentionCase, *, impl: Callable[..., Any] | None = None,
                   require_log: bool = True) -> None:
    """:func:`attention_matches` for the ring."""
    attention_matches(case, ContextParallel.RING, impl=impl, require_log=require_log)


def all_gather_attention(case: ds.CPAttentionCase, *, impl: Callable[..., Any] | None = None,
                         require_log: bool = True) -> None:
    """:func:`attention_matches` for the all-gather of K and V."""
    attention_matches(case, ContextParallel.ALL_GATHER, impl=impl, require_log=require_log)


def ulysses_attention(case: ds.CPAttentionCase, *, impl: Callable[..., Any] | None = None,
                      require_log: bool = True) -> None:
    """:func:`attention_matches` for Ulysses, whose refusals of indivisible heads are part of the claim."""
    attention_matches(case, ContextParallel.ULYSSES, impl=impl, require_log=require_log)


def merge_online_softmax(case: ds.CPMergeCase, *, impl: Callable[..., Any] | None = None) -> None:
    """The merge ``impl(a, b) -> Partial`` (module doc): commutative bit for bit, any order within the bound
    of the single block, exact on exact cases."""
    ref = _ref()
    impl = impl or ref.merge_partials
    parts = [ref.scores_partial(case.scores[..., lo:hi], case.v[lo:hi])
             for lo, hi in zip(case.bounds[:-1], case.bounds[1:], strict=True)]
    blocks = [parts[i] for i in case.order]

    def merge(a: Any, b: Any) -> Any:
        got = call_impl("merge_partials", impl, a, b)
        if not all(hasattr(got, f) for f in ("m", "l", "acc")):
            raise PropertyFailure("merge_partials must return a Partial (m, l, acc)", expected="Partial", got=got)
        return got

    if len(blocks) >= 2:
        ab, ba = merge(blocks[0], blocks[1]), merge(blocks[1], blocks[0])
        for f in ("m", "l", "acc"):
            assert_bitwise_equal(np.asarray(getattr(ab, f), dtype=np.float64),
                                 np.asarray(getattr(ba, f), dtype=np.float64), what=f"merge(a, b).{f} vs merge(b, a)")
    fold = blocks[0]
    for p in blocks[1:]:
        fold = merge(fold, p)
    level = list(blocks)
    while len(level) > 1:
        level = [merge(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    results = {"left fold": fold, "balanced tree": level[0]}
    if case.exact:
        M = float(np.max(case.scores))
        seen = np.isfinite(case.scores)                             # (rows, H, n_k)
        v = case.v[:, 0, :]
        count = seen[:, 0, :].sum(axis=-1, keepdims=True).astype(float)
        acc = to_exact(seen[:, 0, :].astype(float)) @ to_exact(v)
        for how, got in results.items():
            assert_bitwise_equal(np.full_like(count, M), np.asarray(got.m, dtype=np.float64), what=f"{how}: m")
            assert_bitwise_equal(count, np.asarray(got.l, dtype=np.float64), what=f"{how}: l")
            assert_within(acc, np.asarray(got.acc, dtype=np.float64)[:, 0, :], 0, what=f"{how}: acc (exact)")
        return
    expected, _ = ref.finalize(ref.scores_partial(case.scores, case.v))
    finite = np.where(np.isfinite(case.scores), case.scores, np.nan)
    R = float(np.nanmax(finite) - np.nanmin(finite))
    bound = 8 * (math.expm1(2 * U * R) + _g(case.v.shape[0] + 2 * len(blocks) + 8)) * float(np.abs(case.v).max())
    for how, got in results.items():
        out, _ = ref.finalize(got)
        assert_within(expected, out, bound, what=f"online-softmax merge, {how} of {len(blocks)} blocks")


def balance_equal_work(case: tuple[int, int], *, impl: Callable[..., Any] | None = None) -> None:
    """``impl(s, cp)`` (:func:`~distcheck.parallel.cp.reference.load_balanced_positions`): the ranks' positions
    partition 0 .. s-1 in shards of s/cp tokens, and every rank's causal work is cp.causal_work.balanced."""
    ref = _ref()
    s, cp = case
    impl = impl or ref.load_balanced_positions
    positions = call_impl("load_balanced_positions", impl, s, cp)
    if len(positions) != cp or sorted(np.concatenate(positions).tolist()) != list(range(s)) or \
            any(len(p) != s // cp for p in positions):
        raise PropertyFailure(f"positions (s={s}, cp={cp}) must partition 0 .. s-1 into cp shards of s/cp",
                              expected=s // cp, got=[np.asarray(p).tolist() for p in positions])
    work = ref.causal_work(positions)
    form = form_value("cp.causal_work.balanced", s=s, cp=cp)
    if any(Fraction(w) != form for w in work):
        raise PropertyFailure(f"causal work per rank (s={s}, cp={cp}) vs cp.causal_work.balanced", expected=form,
                              got=work)


def _a(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _attention_edges() -> tuple[ds.CPAttentionCase, ...]:
    """cp = 2 and 4 over the head-tail split, causal, grouped-query (2 query heads per kv head); contiguous
    shards; no mask; one rank."""
    rng = np.random.default_rng(7)

    def case(cp: int, s: int, H: int, Hkv: int, e: int, causal: bool = True,
             balanced: bool = True) -> ds.CPAttentionCase:
        q = rng.integers(-8, 9, (s, H, e)) / 4
        k, v = rng.integers(-8, 9, (s, Hkv, e)) / 4, rng.integers(-8, 9, (s, Hkv, e)) / 4
        return ds.CPAttentionCase(q=q, k=k, v=v, dout=rng.integers(-8, 9, (s, H, e)) / 4, cp=cp, causal=causal,
                                  balanced=balanced)

    return (case(2, 4, 2, 1, 2), case(2, 8, 4, 2, 2), case(4, 8, 4, 4, 1), case(2, 4, 2, 2, 2, balanced=False),
            case(2, 4, 2, 2, 1, causal=False), case(1, 2, 2, 1, 2))


def _ulysses_edges() -> tuple[ds.CPAttentionCase, ...]:
    """Ulysses' refusals (cp = 2 with one kv head; cp = 2 with 3 heads), then cases it must compute."""
    base = _attention_edges()
    one_kv = base[0]                                           # cp=2, H=2, Hkv=1: Hkv not divisible
    z = np.zeros((4, 3, 1))
    three = ds.CPAttentionCase(q=z + 0.25, k=z, v=z + 1, dout=z, cp=2)
    return (one_kv, three) + base[1:]


def _merge_edges() -> tuple[ds.CPMergeCase, ...]:
    """Logits near 750 (exp overflows unless the max is subtracted); an exact case in three blocks; one block."""
    big = _a([[[750.0, 749.5, 748.0, 750.25]]])
    v = _a([[[1.0]], [[-2.0]], [[0.5]], [[0.25]]])
    exact = np.where(_a([[[1, 1, 0, 1, 1, 0]]]) > 0, 0.75, -np.inf)
    return (ds.CPMergeCase(scores=big, v=v, bounds=(0, 2, 4), order=(1, 0)),
            ds.CPMergeCase(scores=exact, v=_a([[[1.0]], [[0.5]], [[2.0]], [[-1.0]], [[0.25]], [[3.0]]]),
                           bounds=(0, 2, 3, 6), order=(2, 0, 1), exact=True),
            ds.CPMergeCase(scores=_a([[[0.5, -1.0]]]), v=_a([[[1.0]], [[2.0]]]), bounds=(0, 2), order=(0,)))


_STEP = "{v}_step(q_shards, k_shards, v_shards, dout_shards, positions, *, causal=True, log=None, grad_log=None) " \
        "-> (out_shards, (dq_shards, dk_shards, dv_shards))"

for _variant, _fn, _edges, _what in (
        (ContextParallel.RING, ring_attention, _attention_edges, "K/V blocks passed round the ring, partials merged"),
        (ContextParallel.ALL_GATHER, all_gather_attention, _attention_edges,
         "K and V all-gathered, dK and dV reduce-scattered"),
        (ContextParallel.ULYSSES, ulysses_attention, _ulysses_edges,
         "all-to-alls to head shards and back; refuses cp not dividing the heads")):
    register(Property(f"cp.{_variant}.attention", lambda: ds.cp_attention_cases(), _fn,
                      f"{_what}: outputs and gradients == full attention within the derived bound; bytes per rank "
                      f"== cp.{_variant}.bytes_per_rank.forward/backward", None, _STEP.format(v=_variant), _edges))
register(Property("cp.merge.online_softmax", lambda: ds.cp_merge_cases(), merge_online_softmax,
                  "online-softmax merge: commutative bit for bit; any order within the bound of one block; exact "
                  "on equal maxima", None, "merge_partials(a: Partial, b: Partial) -> Partial", _merge_edges))
register(Property("cp.balance.equal_work", lambda: ds.cp_balance_cases(), balance_equal_work,
                  "head-tail split into 2 cp chunks: a partition with equal causal work on every rank "
                  "(== cp.causal_work.balanced); exact", None, "load_balanced_positions(s, cp) -> list[ndarray]",
                  lambda: ((4, 2), (16, 4), (2, 1), (48, 8))))
