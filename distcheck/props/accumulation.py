"""Gradient-accumulation properties: the accumulated gradient must not depend on how
the same sequences are cut into micro-batches, given the right normalisation.

Model: token-level least squares (:func:`distcheck.dp.token_mse_grad_sum`) with a
0/1 mask of valid tokens; integer-valued inputs (:func:`distcheck.strategies.accumulation_cases`),
so every micro-batch gradient *sum* G_i is an exact integer.

Implementation slot (``impl``): ``accumulate(grad_fn_sum, params, X, y, microbatch_sizes, mask) -> gradient``.
Reference: :func:`distcheck.dp.accumulate_grads` with ``normalize="tokens"``
(mask given) or ``"examples"`` (mask None).
"""

from __future__ import annotations

import numpy as np

from distcheck import strategies as ds
from distcheck.core.exactness import assert_bitwise_equal
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl

__all__ = ["accumulate"]


def accumulate(grad_fn_sum, params, X, y, microbatch_sizes, mask=None):
    """Reference: sum of micro-batch gradient sums divided by the total count (tokens when
    ``mask`` is given, else examples): :func:`distcheck.dp.accumulate_grads`."""
    from distcheck.dp import accumulate_grads

    normalize = "examples" if mask is None else "tokens"
    return accumulate_grads(grad_fn_sum, params, X, y, microbatch_sizes, normalize=normalize, mask=mask).grad


def _seq_grad_sum(w, X, y):
    """Gradient of the squared error summed over every token of the given sequences."""
    from distcheck.dp import mse_grad_sum

    return mse_grad_sum(w, X.reshape(-1, X.shape[-1]), y.reshape(-1))


def tokens_split_invariant(case, *, impl=accumulate) -> None:
    """Token-normalised accumulation: two splits give the same gradient bit for bit, equal
    to the full-batch token-mean gradient (exact sum G of integer G_i, one division by T)."""
    from distcheck.dp import token_mse_grad, token_mse_grad_sum

    a = call_impl("accumulate", impl, token_mse_grad_sum, case.w, case.X, case.y, list(case.split_a), case.mask)
    b = call_impl("accumulate", impl, token_mse_grad_sum, case.w, case.X, case.y, list(case.split_b), case.mask)
    full = token_mse_grad(case.w, case.X, case.y, case.mask)
    assert_bitwise_equal(full, a, what=f"accumulated gradient (split {case.split_a}) vs full batch")
    assert_bitwise_equal(a, b, what=f"split {case.split_a} vs split {case.split_b}")


def examples_split_invariant(case, *, impl=accumulate) -> None:
    """Example-normalised accumulation (every token valid, each sequence one example of
    summed token losses): two splits give the full-batch gradient G / num_sequences bit for bit."""
    a = call_impl("accumulate", impl, _seq_grad_sum, case.w, case.X, case.y, list(case.split_a), None)
    b = call_impl("accumulate", impl, _seq_grad_sum, case.w, case.X, case.y, list(case.split_b), None)
    full = _seq_grad_sum(case.w, case.X, case.y) / case.X.shape[0]
    assert_bitwise_equal(full, a, what=f"accumulated gradient (split {case.split_a}) vs full batch")
    assert_bitwise_equal(a, b, what=f"split {case.split_a} vs split {case.split_b}")


_SIG = "accumulate(grad_fn_sum, params, X, y, microbatch_sizes: list[int], mask: ndarray (batch, seq) | None) -> gradient"


def _edges():
    """Three sequences as one micro-batch or as 1 + 2 (micro-batches of unequal size: a mean of
    per-micro-batch means weighs them wrongly), then with a masked token (unequal token counts)."""

    def case(X, y, mask, a, b):
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
    accumulate, _SIG, _edges,
))
register(Property(
    "accumulation.examples.split_invariant",
    lambda: ds.accumulation_cases(),
    examples_split_invariant,
    "example-normalised accumulation == full-batch mean for any micro-batch split, bit for bit",
    accumulate, _SIG, _edges,
))
