"""Gradient accumulation over micro-batches, and the token-level loss it is checked on.

Accumulating the *summed* gradients of consecutive micro-batches and dividing once by the
total number of examples (or of valid tokens) gives the full-batch gradient whatever the
split; the common bug, a mean per micro-batch and then a mean of those means, depends on
the split unless every micro-batch holds the same count (the lesson "Scaling and distributed
training", gradient accumulation; the chapter "Chapter 26: Distributed Training" of
*Language Modelling: The Complete Guide*).

Conventions as :mod:`distcheck.parallel.dp.reference` (the shards of the data-parallel side).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import as_array, as_int_list, check_callable, check_choice
from distcheck.parallel.dp.reference import _map, _sum, plain_mean, split_batch

__all__ = ["token_mse_loss", "token_mse_grad", "token_mse_grad_sum", "AccumulationResult", "accumulate_grads"]

_NORMALIZE = ("examples", "tokens", "per_microbatch_mean")


# ----------------------------------------------------------------------------- token-level model


def _check_tokens(w: ArrayLike, X: ArrayLike, y: ArrayLike, mask: ArrayLike) -> tuple[np.ndarray, np.ndarray,
                  np.ndarray, np.ndarray]:
    X = as_array("X", X)
    if X.ndim != 3:
        raise ConfigError("X.shape", X.shape, "must be (batch, seq, d)")
    y, w = as_array("y", y), as_array("w", w, ndim=(1, 2))
    mask = as_array("mask", mask, allow_object=False)
    if mask.shape != X.shape[:2]:
        raise ConfigError("mask.shape", mask.shape, f"must be {X.shape[:2]} (batch, seq)")
    if not np.all((mask == 0) | (mask == 1)):
        raise ConfigError("mask", "non-0/1 entries", "must contain only 0 and 1")
    if w.shape[:1] != X.shape[2:]:
        raise ConfigError("w.shape", w.shape, f"must start with d={X.shape[2]}")
    if y.shape != X.shape[:2] + w.shape[1:]:
        raise ConfigError("y.shape", y.shape, f"must be {X.shape[:2] + w.shape[1:]}")
    b, s, d = X.shape
    Xf = X.reshape(b * s, d)
    yf = y.reshape((b * s,) + w.shape[1:])
    mf = mask.reshape(b * s)
    if w.ndim == 2:
        mf = mf[:, None]
    return Xf, yf, mf, w


def token_mse_grad_sum(w: ArrayLike, X: ArrayLike, y: ArrayLike, mask: ArrayLike) -> np.ndarray:
    """Gradient of the squared error summed over *valid* tokens.

    ``sum_{i,t} mask[i,t] ||X[i,t] w - y[i,t]||^2`` has gradient
    ``2 sum_{i,t} mask[i,t] X[i,t]^T (X[i,t] w - y[i,t])``.

    Args: ``w`` (d,) or (d, k); ``X`` (batch, seq, d); ``y`` (batch, seq) or
    (batch, seq, k); ``mask`` (batch, seq) of 0/1 (1 = valid token).
    Raises ConfigError on shape mismatch or a mask entry other than 0/1.
    """
    Xf, yf, mf, w = _check_tokens(w, X, y, mask)
    return 2 * (Xf.T @ (mf * (Xf @ w - yf)))


def token_mse_loss(w: ArrayLike, X: ArrayLike, y: ArrayLike, mask: ArrayLike) -> Any:
    """Token-normalised loss: squared error summed over valid tokens / number of valid tokens.

    Raises ConfigError when the mask has no valid token.
    """
    Xf, yf, mf, w = _check_tokens(w, X, y, mask)
    tokens = int(np.sum(mf))
    if tokens == 0:
        raise ConfigError("mask", "all zeros", "must have at least one valid token")
    r = mf * (Xf @ w - yf)
    return np.sum(r * r) / tokens


def token_mse_grad(w: ArrayLike, X: ArrayLike, y: ArrayLike, mask: ArrayLike) -> np.ndarray:
    """Gradient of :func:`token_mse_loss` (the full-batch answer for token normalisation).

    Shapes as :func:`token_mse_grad_sum`; returns an array shaped like ``w``.
    Raises ConfigError on a shape mismatch, a mask entry other than 0/1, or no valid token.
    """
    Xf, yf, mf, w = _check_tokens(w, X, y, mask)
    tokens = int(np.sum(mf))
    if tokens == 0:
        raise ConfigError("mask", "all zeros", "must have at least one valid token")
    return 2 * (Xf.T @ (mf * (Xf @ w - yf))) / tokens


# ----------------------------------------------------------------------------- accumulation


@dataclass(frozen=True)
class AccumulationResult:
    """Result of :func:`accumulate_grads`.

    Attributes: ``grad`` (array or dict), ``counts`` (examples or valid tokens per
    micro-batch, the normaliser's unit), ``normalize`` (the rule used).
    """

    grad: object
    counts: tuple[int, ...]
    normalize: str


def accumulate_grads(
    grad_fn_sum: Callable,
    params: Any,
    X: ArrayLike,
    y: ArrayLike,
    microbatch_sizes: Sequence[int],
    normalize: str = "examples",
    mask: ArrayLike | None = None,
) -> AccumulationResult:
    """Gradient accumulation over consecutive micro-batches (split along axis 0).

    ``grad_fn_sum(params, X_i, y_i)`` (or ``grad_fn_sum(params, X_i, y_i, mask_i)``
    when ``mask`` is given) returns the gradient of the *sum* of per-example (or
    per-valid-token) losses of micro-batch ``i``; call it ``G_i``.

    ``normalize``:
      * ``"examples"``: ``sum_i G_i / sum_i n_i``: the full-batch mean-over-examples
        gradient, whatever the micro-batch split.
      * ``"tokens"``: ``sum_i G_i / sum_i T_i`` with ``T_i`` the valid tokens of
        micro-batch ``i`` (needs ``mask``): the full-batch mean-over-tokens
        gradient, whatever the split.
      * ``"per_microbatch_mean"``: ``(1/m) sum_i G_i / c_i`` with ``c_i = T_i``
        (mask given) or ``n_i``: the common bug; it depends on the split unless
        every ``c_i`` is equal.

    Args: ``X`` (batch, ...) and ``y`` (batch, ...); ``mask`` (batch, seq) of 0/1
    or None; ``microbatch_sizes`` positive ints summing to ``batch``.
    Raises ConfigError on bad sizes, an unknown ``normalize``, ``"tokens"``
    without a mask, or a count of zero where it is a divisor.
    """
    check_choice("normalize", normalize, _NORMALIZE)
    check_callable("grad_fn_sum", grad_fn_sum)
    X, y = as_array("X", X, min_ndim=1), as_array("y", y, min_ndim=1)
    sizes = as_int_list("microbatch_sizes", microbatch_sizes, min_value=1)
    if y.shape[:1] != X.shape[:1]:
        raise ConfigError("y.shape", y.shape, f"must start with batch={X.shape[0]} (rows of X)")
    if normalize == "tokens" and mask is None:
        raise ConfigError("mask", None, "is required when normalize='tokens'")
    Xs, ys = split_batch(X, sizes), split_batch(y, sizes)
    if mask is not None:
        mask = as_array("mask", mask, min_ndim=1, allow_object=False)
        if mask.shape[:1] != X.shape[:1]:
            raise ConfigError("mask.shape", mask.shape, f"must start with batch={X.shape[0]}")
        ms = split_batch(mask, sizes)
        sums = [grad_fn_sum(params, a, b, c) for a, b, c in zip(Xs, ys, ms, strict=True)]
        counts = tuple(int(np.sum(c)) for c in ms)
    else:
        sums = [grad_fn_sum(params, a, b) for a, b in zip(Xs, ys, strict=True)]
        counts = tuple(sizes)
    if normalize == "examples":
        total = sum(sizes)
        grad = _map(lambda a: a / total, _sum(sums))
        return AccumulationResult(grad, tuple(sizes), normalize)
    if normalize == "tokens":
        total = sum(counts)
        if total == 0:
            raise ConfigError("mask", "all zeros", "must have at least one valid token")
        return AccumulationResult(_map(lambda a: a / total, _sum(sums)), counts, normalize)
    for i, c in enumerate(counts):
        if c == 0:
            raise ConfigError(f"mask[micro-batch {i}]", "all zeros", "must have a valid token to take its mean")
    means = [_map(lambda a, c=c: a / c, G) for G, c in zip(sums, counts, strict=True)]
    return AccumulationResult(plain_mean(means), counts, normalize)
