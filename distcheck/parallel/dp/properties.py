"""Data-parallel and gradient-accumulation properties.

Data parallelism: the all-reduced gradient against the full-batch gradient.

Model: least squares, per-shard gradient of the *mean* loss
``mse_grad(w, X_k, y_k) = 2 X_k^T (X_k w - y_k) / n_k`` (:mod:`distcheck.parallel.dp`).
Inputs are integer-valued (:func:`distcheck.strategies.dp_cases`), so every shard
gradient *sum* ``G_k = 2 X_k^T (X_k w - y_k)`` is an exact integer.

Implementation slot (``impl``): a combiner ``combine(grads, sizes) -> gradient``
taking the per-shard mean gradients and the shard sizes (the all-reduce rule).
Reference: :func:`distcheck.parallel.dp.weighted_mean` for the weighted properties,
``plain_mean(grads)`` for the plain-mean properties.

Gradient accumulation (``accumulation.*``): the accumulated gradient must not depend on how
the same sequences are cut into micro-batches, given the right normalisation.

Model: token-level least squares (:func:`distcheck.parallel.dp.token_mse_grad_sum`) with a
0/1 mask of valid tokens; integer-valued inputs (:func:`distcheck.strategies.accumulation_cases`),
so every micro-batch gradient *sum* G_i is an exact integer.

Implementation slot (``impl``): ``accumulate(grad_fn_sum, params, X, y, microbatch_sizes, mask) -> gradient``.
Reference: :func:`distcheck.parallel.dp.accumulate_grads` with ``normalize="tokens"``
(mask given) or ``"examples"`` (mask None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.exactness import assert_bitwise_equal, assert_within, chain_bound, gamma, to_exact
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.dp import strategies as ds

#: a combiner slot: ``impl(grads, sizes)``, the ranks' shard-mean gradients and their example counts
Combiner = Callable[[Sequence[np.ndarray], Sequence[int]], object]

__all__ = [
    "weighted_combine",
    "plain_combine",
    "equal_shards_bitwise",
    "unequal_shards_weighted",
    "plain_mean_bias",
    "any_shards_bounded",
    "accumulate",
    "tokens_split_invariant",
    "examples_split_invariant",
]


def weighted_combine(grads: Sequence[np.ndarray], sizes: Sequence[int]) -> object:
    """Reference combiner: example-weighted mean ``sum_k n_k g_k / n`` (:func:`distcheck.parallel.dp.weighted_mean`)."""
    from distcheck.parallel.dp.reference import weighted_mean

    return weighted_mean(grads, sizes)


def plain_combine(grads: Sequence[np.ndarray], sizes: Sequence[int]) -> object:
    """Plain mean ``(1/N) sum_k g_k`` (what DDP's all-reduce does; exact only for equal shards)."""
    from distcheck.parallel.dp.reference import plain_mean

    return plain_mean(grads)


def _shards(case: ds.DPCase) -> tuple[list[np.ndarray], list[np.ndarray]]:
    from distcheck.parallel.dp.reference import mse_grad, mse_grad_sum, split_batch

    Xs, ys = split_batch(case.X, case.shard_sizes), split_batch(case.y, case.shard_sizes)
    means = [mse_grad(case.w, Xk, yk) for Xk, yk in zip(Xs, ys, strict=True)]
    sums = [to_exact(mse_grad_sum(case.w, Xk, yk)) for Xk, yk in zip(Xs, ys, strict=True)]  # exact integers
    return means, sums


def equal_shards_bitwise(case: ds.DPCase, *, impl: Combiner = plain_combine) -> None:
    """Equal power-of-two shards: the combined gradient is the full-batch gradient bit for bit.

    Every G_k is an exact integer and n_k, N are powers of two, so G_k / n_k and the
    sum / N are exact; the full gradient G / n rounds once from the same exact value.
    """
    from distcheck.parallel.dp.reference import mse_grad

    means, _ = _shards(case)
    got = call_impl("combine", impl, means, list(case.shard_sizes))
    assert_bitwise_equal(mse_grad(case.w, case.X, case.y), got, what="all-reduced gradient vs full batch")


def unequal_shards_weighted(case: ds.DPCase, *, impl: Combiner = weighted_combine) -> None:
    """Unequal power-of-two shards: the example-weighted mean equals the full gradient bit for bit.

    n_k g_k = G_k exactly (n_k a power of two), their sum is the exact integer G, and
    the final division by n rounds once, exactly as the full-batch ``G / n`` does.
    """
    from distcheck.parallel.dp.reference import mse_grad

    means, _ = _shards(case)
    got = call_impl("combine", impl, means, list(case.shard_sizes))
    assert_bitwise_equal(mse_grad(case.w, case.X, case.y), got, what="weighted all-reduce vs full batch")


def plain_mean_bias(case: ds.DPCase, *, impl: Combiner = plain_combine) -> None:
    """Unequal shards: the plain mean is off by exactly sum_k (w_plain(k) - w_exact) G_k.

    The weights come from the closed forms ``dp.plain_mean_weight`` = 1/(dp n_k) and
    ``dp.exact_weight`` = 1/n. With power-of-two n_k every G_k / n_k and their sum
    are exact, so the plain mean P rounds once (the division by N) and the full
    gradient G/n rounds once: |got - expected| <= u |P| + u |G/n| (gamma_1 each).
    """
    from distcheck.engine.catalogue import get
    from distcheck.parallel.dp.reference import mse_grad

    plain_w, exact_w = get("dp.plain_mean_weight"), get("dp.exact_weight")
    means, sums = _shards(case)
    N, n = len(case.shard_sizes), sum(case.shard_sizes)
    got = (to_exact(call_impl("combine", impl, means, list(case.shard_sizes)))
           - to_exact(mse_grad(case.w, case.X, case.y)))
    expected = sum(
        (G * (Fraction(plain_w.evaluate(dp=N, n_k=nk)) - Fraction(exact_w.evaluate(n=n)))
         for G, nk in zip(sums, case.shard_sizes, strict=True)),
        np.zeros(case.w.shape, dtype=object) * Fraction(0),
    )
    G = sum(sums, np.zeros(case.w.shape, dtype=object) * Fraction(0))
    P = sum((Gk * Fraction(plain_w.evaluate(dp=N, n_k=nk)) for Gk, nk in zip(sums, case.shard_sizes, strict=True)),
            G * 0)
    bound = chain_bound(np.abs(P), 1) + chain_bound(np.abs(G / n), 1)
    assert_within(expected, got, bound, what="plain mean - full gradient vs closed-form bias")


def any_shards_bounded(case: ds.DPCase, *, impl: Combiner = weighted_combine) -> None:
    """Any shard sizes (not powers of two): the weighted mean is within a derived bound.

    Path of each term G_k: /n_k (1 rounding), *n_k (1), N-1 additions, /n (1):
    at most N+2 roundings, so |got - G/n| <= gamma_{N+2} * sum_k |G_k| / n
    (Higham Lemma 3.1; G_k exact integers).
    """
    means, sums = _shards(case)
    N, n = len(case.shard_sizes), sum(case.shard_sizes)
    got = call_impl("combine", impl, means, list(case.shard_sizes))
    G = sum(sums, np.zeros(case.w.shape, dtype=object) * Fraction(0))
    abs_terms = sum((np.abs(Gk) for Gk in sums), np.zeros(case.w.shape, dtype=object) * Fraction(0))
    assert_within(G / n, got, gamma(N + 2) * abs_terms / n, what="weighted all-reduce vs exact full gradient")


_SIG = "combine(grads: list[ndarray (features,)], sizes: list[int]) -> ndarray (features,)"


def _dp_case(sizes: Sequence[int], X: ArrayLike, y: ArrayLike, w: ArrayLike) -> ds.DPCase:
    return ds.DPCase(X=np.array(X, dtype=float), y=np.array(y, dtype=float), w=np.array(w, dtype=float),
                     shard_sizes=tuple(sizes))


def _equal_edges() -> tuple[ds.DPCase, ...]:
    """One shard (nothing to average), and two equal shards."""
    return (_dp_case((1,), [[1]], [2], [0]), _dp_case((2, 2), [[1], [2], [0], [1]], [0, 1, 2, 3], [1]))


def _unequal_edges() -> tuple[ds.DPCase, ...]:
    """The lesson's split of three examples as 2 + 1: a plain mean weighs the lone example twice."""
    return (_dp_case((2, 1), [[1], [1], [1]], [0, 0, 2], [0]),)


def _any_edges() -> tuple[ds.DPCase, ...]:
    """Shards of 3 and 1 and 2 (no power of two): the weighted mean rounds."""
    return (*_unequal_edges(), _dp_case((3, 1, 2), [[1], [2], [3], [1], [0], [1]], [1, 0, 2, 3, 1, 0], [1]))


register(Property(
    "dp.equal_shards.bitwise",
    lambda: ds.dp_cases(equal_shards=True, powers_of_two=True),
    equal_shards_bitwise,
    "equal shards (powers of two): mean of shard gradients == full-batch gradient, bit for bit",
    plain_combine, _SIG, _equal_edges,
))
register(Property(
    "dp.unequal_shards.weighted",
    lambda: ds.dp_cases(equal_shards=False, powers_of_two=True),
    unequal_shards_weighted,
    "unequal shards: example-weighted all-reduce == full-batch gradient, bit for bit",
    weighted_combine, _SIG, _unequal_edges,
))
register(Property(
    "dp.unequal_shards.plain_mean_bias",
    lambda: ds.dp_cases(min_shards=1, powers_of_two=True, max_shards=8, equal_shards=None),
    plain_mean_bias,
    "plain mean - full gradient == sum_k (1/(dp n_k) - 1/n) G_k (closed forms), within u(|P| + |G/n|)",
    plain_combine, _SIG, _unequal_edges,
))
register(Property(
    "dp.any_shards.bounded",
    lambda: ds.dp_cases(),
    any_shards_bounded,
    "any shard sizes: weighted all-reduce within gamma_{N+2} sum|G_k|/n of the exact full gradient",
    weighted_combine, _SIG, _any_edges,
))


# ----------------------------------------------------------------------------- gradient accumulation


def accumulate(grad_fn_sum: Callable[..., Any], params: Any, X: ArrayLike, y: ArrayLike,
               microbatch_sizes: Sequence[int], mask: ArrayLike | None = None) -> object:
    """Reference: sum of micro-batch gradient sums divided by the total count (tokens when
    ``mask`` is given, else examples): :func:`distcheck.parallel.dp.accumulate_grads`."""
    from distcheck.parallel.dp.accumulation import accumulate_grads

    normalize = "examples" if mask is None else "tokens"
    return accumulate_grads(grad_fn_sum, params, X, y, microbatch_sizes, normalize=normalize, mask=mask).grad


def _seq_grad_sum(w: ArrayLike, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of the squared error summed over every token of the given sequences."""
    from distcheck.parallel.dp.reference import mse_grad_sum

    return mse_grad_sum(w, X.reshape(-1, X.shape[-1]), y.reshape(-1))


def tokens_split_invariant(case: ds.AccumulationCase, *, impl: Callable[..., Any] = accumulate) -> None:
    """Token-normalised accumulation: two splits give the same gradient bit for bit, equal
    to the full-batch token-mean gradient (exact sum G of integer G_i, one division by T)."""
    from distcheck.parallel.dp.accumulation import token_mse_grad, token_mse_grad_sum

    a = call_impl("accumulate", impl, token_mse_grad_sum, case.w, case.X, case.y, list(case.split_a), case.mask)
    b = call_impl("accumulate", impl, token_mse_grad_sum, case.w, case.X, case.y, list(case.split_b), case.mask)
    full = token_mse_grad(case.w, case.X, case.y, case.mask)
    assert_bitwise_equal(full, a, what=f"accumulated gradient (split {case.split_a}) vs full batch")
    assert_bitwise_equal(a, b, what=f"split {case.split_a} vs split {case.split_b}")


def examples_split_invariant(case: ds.AccumulationCase, *, impl: Callable[..., Any] = accumulate) -> None:
    """Example-normalised accumulation (every token valid, each sequence one example of
    summed token losses): two splits give the full-batch gradient G / num_sequences bit for bit."""
    a = call_impl("accumulate", impl, _seq_grad_sum, case.w, case.X, case.y, list(case.split_a), None)
    b = call_impl("accumulate", impl, _seq_grad_sum, case.w, case.X, case.y, list(case.split_b), None)
    full = _seq_grad_sum(case.w, case.X, case.y) / case.X.shape[0]
    assert_bitwise_equal(full, a, what=f"accumulated gradient (split {case.split_a}) vs full batch")
    assert_bitwise_equal(a, b, what=f"split {case.split_a} vs split {case.split_b}")


_ACC_SIG = ("accumulate(grad_fn_sum, params, X, y, microbatch_sizes: list[int], mask: ndarray (batch, seq) | None) "
            "-> gradient")


def _acc_edges() -> tuple[ds.AccumulationCase, ...]:
    """Three sequences as one micro-batch or as 1 + 2 (micro-batches of unequal size: a mean of
    per-micro-batch means weighs them wrongly), then with a masked token (unequal token counts)."""

    def case(X: ArrayLike, y: ArrayLike, mask: ArrayLike, a: tuple[int, ...],
             b: tuple[int, ...]) -> ds.AccumulationCase:
        X = np.array(X, dtype=float)
        return ds.AccumulationCase(X=X, y=np.array(y, dtype=float), w=np.zeros(X.shape[-1]),
                                   mask=np.array(mask, dtype=float), split_a=a, split_b=b)

    return (case([[[1]], [[1]], [[1]]], [[0], [0], [3]], [[1], [1], [1]], (3,), (1, 2)),
            case([[[1], [1]], [[1], [2]]], [[1, 0], [0, 2]], [[1, 0], [1, 1]], (2,), (1, 1)))


register(Property(
    "accumulation.tokens.split_invariant",
    lambda: ds.accumulation_cases(),
    tokens_split_invariant,
    "token-normalised accumulation == full-batch token mean for any micro-batch split, bit for bit",
    accumulate, _ACC_SIG, _acc_edges,
))
register(Property(
    "accumulation.examples.split_invariant",
    lambda: ds.accumulation_cases(),
    examples_split_invariant,
    "example-normalised accumulation == full-batch mean for any micro-batch split, bit for bit",
    accumulate, _ACC_SIG, _acc_edges,
))
