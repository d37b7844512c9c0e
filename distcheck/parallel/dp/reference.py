"""Data parallelism, reference implementation (numpy, pure functions).

Each of ``dp`` ranks gets a contiguous shard of the batch (``np.array_split``
order), computes the gradient of its *local mean* loss, and an all-reduce
combines the shard gradients. With equal shards the plain mean of the shard
gradients is the full-batch gradient (lesson, "Data parallelism is exact");
with unequal shards it is not, and weighting each shard by its example count
restores the identity (lesson, implementation challenge).

Conventions
-----------
* ``X`` has shape ``(n, d)`` (examples along axis 0), ``w`` has shape ``(d,)``
  or ``(d, k)``, ``y`` has shape ``(n,)`` or ``(n, k)`` to match ``X @ w``.
* The MSE loss is the mean over examples of the squared error summed over
  outputs: ``L = (1/n) * sum_i ||x_i w - y_i||^2``.
* A gradient is an array or a ``dict`` of arrays (the MLP); every combinator
  here accepts both.
* The functions are dtype-generic: float64 arrays in normal use, or object
  arrays of ``fractions.Fraction`` (exact) / ``decimal.Decimal`` (high
  precision) for exact checks. Nothing casts to float.
* Inputs are checked at the boundary of every public function: arrays must be
  numeric (or object arrays of real numbers), finite (no NaN/infinity) and
  non-empty (``n >= 1`` examples), with matching shapes; anything else raises
  :class:`~distcheck.core.errors.ConfigError` naming the argument (never NaN with a
  RuntimeWarning, or a numpy error from deep inside).

Token-level losses and gradient accumulation are :mod:`distcheck.parallel.dp.accumulation`.

Floating-point bounds use the standard model ``fl(a op b) = (a op b)(1 + e)``,
``|e| <= u = 2**-53`` and ``gamma_k = k u / (1 - k u)`` (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., Lemma 3.1 and section 3.1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.exactness import gamma as exact_gamma
from distcheck.core.exactness import unit_roundoff
from distcheck.core.validate import (
    MAX_ELEMENTS,
    MAX_RANKS,
    as_array,
    as_int_list,
    check_at_most,
    check_callable,
    check_choice,
    check_positive_int,
    check_type,
)

__all__ = [
    "UNIT_ROUNDOFF",
    "gamma",
    "shard_sizes",
    "split_batch",
    "mse_loss",
    "mse_grad",
    "mse_grad_sum",
    "MLP_PARAM_NAMES",
    "mlp_init",
    "mlp_loss_and_grad",
    "mlp_grad",
    "mlp_grad_sum",
    "shard_grads",
    "plain_mean",
    "weighted_mean",
    "data_parallel_grad",
    "plain_mean_bias",
    "mse_dp_error_bound",
]

#: unit roundoff of IEEE-754 binary64 (round to nearest)
UNIT_ROUNDOFF = float(unit_roundoff("float64"))

#: keys of the MLP parameter dict
MLP_PARAM_NAMES = ("W1", "b1", "W2", "b2")

_WEIGHTINGS = ("plain", "examples")


def gamma(k: int) -> float:
    """``gamma_k = k u / (1 - k u)`` for float64 (``u = 2**-53``) as a float (Higham, Lemma 3.1).

    Bounds the relative error of a quantity that went through ``k`` roundings.
    The one definition is :func:`distcheck.core.exactness.gamma`, which returns the
    exact :class:`~fractions.Fraction`; this is that value rounded to nearest,
    for multiplying float64 arrays (a Fraction times an ndarray would give an
    object array). It is bitwise the float expression ``k*u / (1 - k*u)``:
    for ``k < 2**53`` both ``k*u`` and ``1 - k*u`` are exact in float64, so
    the only rounding is the division, which IEEE rounds to nearest too.
    :mod:`distcheck.parallel.tp` re-exports this function.

    Raises ConfigError when ``k`` is not an integer >= 0 or ``k u >= 1``.
    """
    return float(exact_gamma(k, "float64"))


# ----------------------------------------------------------------------------- shards


def shard_sizes(n: int, dp: int) -> np.ndarray:
    """Examples per rank when ``n`` examples are split over ``dp`` ranks.

    Same sizes as ``np.array_split``: the first ``n % dp`` ranks get one extra.
    ``shard_sizes(60, 8) -> [8, 8, 8, 8, 7, 7, 7, 7]``.

    Raises ConfigError unless ``n`` and ``dp`` are integers with ``n >= dp >= 1``
    (an empty shard has no mean) and ``dp <= MAX_RANKS`` (2**24).
    """
    dp = check_positive_int("dp", dp)
    n = check_positive_int("n", n)
    check_at_most("dp", dp, MAX_RANKS, "one size is listed per rank (distcheck.core.validate.MAX_RANKS)")
    if n < dp:
        raise ConfigError("dp", dp, f"must be <= n={n} (every rank needs at least one example)")
    base, extra = divmod(n, dp)
    return np.array([base + 1] * extra + [base] * (dp - extra), dtype=np.int64)


def split_batch(arr: ArrayLike, sizes: Sequence[int] | np.ndarray) -> list:
    """Split ``arr`` along axis 0 into consecutive pieces of the given ``sizes``.

    Raises ConfigError if ``arr`` is not a numeric array with an axis 0, a size is
    not an integer >= 0, or the sizes do not sum to ``arr.shape[0]``.
    """
    arr = as_array("arr", arr, min_ndim=1, allow_empty=True)
    sizes = as_int_list("sizes", sizes, min_value=0)
    if sum(sizes) != arr.shape[0]:
        raise ConfigError("sizes", sizes, f"must sum to the batch size {arr.shape[0]}")
    bounds = np.cumsum([0] + sizes)
    return [arr[bounds[i] : bounds[i + 1]] for i in range(len(sizes))]


# ----------------------------------------------------------------------------- tree helpers


def _map(fn: Callable[..., Any], *trees: Any) -> Any:
    """Apply ``fn`` leafwise to arrays or to dicts of arrays with the same keys."""
    first = trees[0]
    if isinstance(first, Mapping):
        for t in trees[1:]:
            if not isinstance(t, Mapping) or set(t) != set(first):
                raise ConfigError("grads", sorted(map(str, first)), "must all be dicts with the same keys")
        return {k: fn(*(t[k] for t in trees)) for k in first}
    return fn(*(np.asarray(t) for t in trees))


def _check_grads(field: str, grads: object) -> list:
    """A non-empty list of gradients: numeric arrays of one shape, or dicts of them with
    the same keys and the same shape per key."""
    if isinstance(grads, (str, bytes, Mapping, np.ndarray)) or not isinstance(grads, Sequence):
        raise ConfigError(field, grads, "must be a list of gradients (arrays, or dicts of arrays), one per rank")
    grads = list(grads)
    if not grads:
        raise ConfigError(field, grads, "must be non-empty")
    first = grads[0]
    keys = sorted(map(str, first)) if isinstance(first, Mapping) else None
    out: list[Any] = []  # all arrays, or all dicts of arrays (as ``first``)
    for i, g in enumerate(grads):
        if isinstance(first, Mapping):
            if not isinstance(g, Mapping) or sorted(map(str, g)) != keys:
                raise ConfigError(field, keys, "must all be dicts with the same keys")
            out.append({k: as_array(f"{field}[{i}][{k!r}]", v, allow_empty=True) for k, v in g.items()})
        else:
            out.append(as_array(f"{field}[{i}]", g, allow_empty=True))
    for i, g in enumerate(out[1:], 1):
        for k in (first if isinstance(first, Mapping) else [None]):
            a, b = (out[0][k], g[k]) if k is not None else (out[0], g)
            if a.shape != b.shape:
                raise ConfigError(f"{field}[{i}]" + (f"[{k!r}]" if k is not None else "") + ".shape", b.shape,
                                  f"must equal the shape of {field}[0] {a.shape}")
    return out


def _sum(trees: Iterable[Any]) -> Any:
    """Left-to-right sum ``((g0 + g1) + g2) + ...`` of arrays or dicts."""
    trees = list(trees)
    if not trees:
        raise ConfigError("grads", trees, "must be non-empty")
    out = trees[0]
    for t in trees[1:]:
        out = _map(lambda a, b: a + b, out, t)
    return out


def _scale_coef(coef: Fraction, like: np.ndarray) -> Fraction | float:
    """``coef`` as a Fraction for object arrays, else rounded once to float."""
    return coef if like.dtype == object else float(coef)


# ----------------------------------------------------------------------------- linear / MSE


def _check_xy(X: ArrayLike, y: ArrayLike, w: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X (n, d) with n, d >= 1; y (n,) or (n, k); w (d,) or (d, k) matching y; all numeric and finite."""
    X = as_array("X", X)
    if X.ndim != 2:
        raise ConfigError("X.shape", X.shape, "must be (n, d)")
    y = as_array("y", y, ndim=(1, 2))
    if y.shape[:1] != X.shape[:1]:
        raise ConfigError("y.shape", y.shape, f"must start with n={X.shape[0]} (rows of X)")
    w = as_array("w", w, ndim=(1, 2))
    if w.shape[:1] != X.shape[1:]:
        raise ConfigError("w.shape", w.shape, f"must start with d={X.shape[1]} (columns of X)")
    if w.shape[1:] != y.shape[1:]:
        raise ConfigError("y.shape", y.shape, f"must match X @ w, shape {(X.shape[0],) + w.shape[1:]}")
    return X, y, w


def mse_loss(w: ArrayLike, X: ArrayLike, y: ArrayLike) -> Any:
    """Mean squared error ``(1/n) sum_i ||x_i w - y_i||^2``.

    Args: ``w`` (d,) or (d, k); ``X`` (n, d); ``y`` (n,) or (n, k).
    Returns a scalar. Raises ConfigError on mismatched shapes.
    """
    X, y, w = _check_xy(X, y, w)
    r = X @ w - y
    return np.sum(r * r) / X.shape[0]


def mse_grad_sum(w: ArrayLike, X: ArrayLike, y: ArrayLike) -> np.ndarray:
    """Gradient of the *sum* of per-example squared errors: ``2 X^T (X w - y)``.

    Same shapes as :func:`mse_loss`; returns an array shaped like ``w``.

    Raises ConfigError on mismatched shapes (see :func:`mse_loss`).
    """
    X, y, w = _check_xy(X, y, w)
    return 2 * (X.T @ (X @ w - y))


def mse_grad(w: ArrayLike, X: ArrayLike, y: ArrayLike) -> np.ndarray:
    """Gradient of :func:`mse_loss`: ``2 X^T (X w - y) / n`` (the lesson's mse_grad).

    Evaluation order (used by :func:`mse_dp_error_bound`): ``X @ w``, minus
    ``y``, ``X.T @ r``, times 2 (exact), divided by ``n``.

    Same shapes as :func:`mse_loss`; returns an array shaped like ``w``.
    Raises ConfigError on mismatched shapes.
    """
    X, y, w = _check_xy(X, y, w)
    return 2 * (X.T @ (X @ w - y)) / X.shape[0]


# ----------------------------------------------------------------------------- MLP


def mlp_init(rng: np.random.Generator, d_in: int, d_hidden: int, d_out: int) -> dict:
    """Parameters of a one-hidden-layer tanh MLP, as a dict of float64 arrays.

    ``W1`` (d_in, d_hidden) and ``W2`` (d_hidden, d_out) are N(0, 1/fan_in);
    ``b1`` (d_hidden,) and ``b2`` (d_out,) are N(0, 0.1^2) (non-zero, so that
    their gradients are exercised). Raises ConfigError on non-positive sizes, more
    than ``MAX_ELEMENTS`` (2**24) weights, or an ``rng`` that is not a ``numpy.random.Generator``.
    """
    check_type("rng", rng, np.random.Generator, "must be a numpy.random.Generator (np.random.default_rng(seed))")
    for name, v in (("d_in", d_in), ("d_hidden", d_hidden), ("d_out", d_out)):
        check_positive_int(name, v)
    check_at_most("d_in*d_hidden + d_hidden*d_out", d_in * d_hidden + d_hidden * d_out, MAX_ELEMENTS,
                  "distcheck.core.validate.MAX_ELEMENTS: elements one init allocates")
    return {
        "W1": rng.standard_normal((d_in, d_hidden)) / np.sqrt(d_in),
        "b1": 0.1 * rng.standard_normal(d_hidden),
        "W2": rng.standard_normal((d_hidden, d_out)) / np.sqrt(d_hidden),
        "b2": 0.1 * rng.standard_normal(d_out),
    }


def _tanh(z: np.ndarray) -> np.ndarray:
    if z.dtype == object:  # Decimal elements: tanh z = (e^{2z} - 1) / (e^{2z} + 1)
        e = np.exp(2 * z)
        return (e - 1) / (e + 1)
    return np.tanh(z)


def mlp_loss_and_grad(params: Mapping[str, np.ndarray], X: ArrayLike, y: ArrayLike, *,
                      reduction: str = "mean") -> tuple[Any, dict[str, np.ndarray]]:
    """Loss and hand-written backprop gradient of ``tanh`` MLP + MSE.

    Forward: ``H = tanh(X W1 + b1)``, ``P = H W2 + b2``,
    loss = ``(1/n) sum_i ||P_i - y_i||^2`` (``reduction="mean"``) or the plain
    sum over examples (``reduction="sum"``, for gradient accumulation).

    Args: ``params`` with keys W1 (d_in, h), b1 (h,), W2 (h, d_out), b2 (d_out,);
    ``X`` (n, d_in); ``y`` (n, d_out).
    Returns ``(loss, grads)`` with ``grads`` a dict shaped like ``params``.
    Raises ConfigError on a missing key, a shape mismatch or a bad ``reduction``.
    """
    check_choice("reduction", reduction, ("mean", "sum"))
    check_type("params", params, Mapping, f"must be a dict with keys {', '.join(MLP_PARAM_NAMES)} (see mlp_init)")
    missing = [k for k in MLP_PARAM_NAMES if k not in params]
    if missing:
        raise ConfigError("params", sorted(map(str, params)), f"must have keys {', '.join(MLP_PARAM_NAMES)}")
    W1 = as_array("params['W1']", params["W1"], ndim=2)
    W2 = as_array("params['W2']", params["W2"], ndim=2)
    h = W1.shape[1]
    if W2.shape[0] != h:
        raise ConfigError("params['W2'].shape", W2.shape, f"must start with h={h} (columns of W1)")
    b1 = as_array("params['b1']", params["b1"])
    b2 = as_array("params['b2']", params["b2"])
    if b1.shape != (h,):
        raise ConfigError("params['b1'].shape", b1.shape, f"must be ({h},)")
    if b2.shape != (W2.shape[1],):
        raise ConfigError("params['b2'].shape", b2.shape, f"must be ({W2.shape[1]},)")
    X, y = as_array("X", X, ndim=2), as_array("y", y)
    if X.shape[1] != W1.shape[0]:
        raise ConfigError("X.shape", X.shape, f"must be (n, {W1.shape[0]})")
    if y.shape != (X.shape[0], W2.shape[1]):
        raise ConfigError("y.shape", y.shape, f"must be ({X.shape[0]}, {W2.shape[1]})")
    n = X.shape[0]
    H = _tanh(X @ W1 + b1)
    R = H @ W2 + b2 - y
    scale = n if reduction == "mean" else 1
    loss = np.sum(R * R) / scale
    dP = 2 * R / scale
    dH = dP @ W2.T
    dZ = dH * (1 - H * H)
    grads = {"W1": X.T @ dZ, "b1": dZ.sum(axis=0), "W2": H.T @ dP, "b2": dP.sum(axis=0)}
    return loss, grads


def mlp_grad(params: Mapping[str, np.ndarray], X: ArrayLike, y: ArrayLike) -> dict[str, np.ndarray]:
    """Gradient of the mean MLP loss (the ``grad_fn`` for :func:`data_parallel_grad`)."""
    return mlp_loss_and_grad(params, X, y)[1]


def mlp_grad_sum(params: Mapping[str, np.ndarray], X: ArrayLike, y: ArrayLike) -> dict[str, np.ndarray]:
    """Gradient of the summed MLP loss (the ``grad_fn_sum`` for :func:`accumulate_grads`)."""
    return mlp_loss_and_grad(params, X, y, reduction="sum")[1]


# ----------------------------------------------------------------------------- data parallel


def shard_grads(grad_fn: Callable, params: Any, X: ArrayLike, y: ArrayLike, dp: int) -> list:
    """Per-rank gradients: ``grad_fn(params, X_k, y_k)`` on each ``np.array_split`` shard.

    ``grad_fn`` returns the gradient of the *mean* loss over its examples (an
    array or a dict of arrays). Raises ConfigError unless ``len(X) >= dp >= 1``,
    ``grad_fn`` is callable and ``X``, ``y`` are numeric arrays with the same rows.
    """
    check_callable("grad_fn", grad_fn)
    X, y = as_array("X", X, min_ndim=1), as_array("y", y, min_ndim=1)
    if y.shape[:1] != X.shape[:1]:
        raise ConfigError("y.shape", y.shape, f"must start with n={X.shape[0]} (rows of X)")
    sizes = shard_sizes(X.shape[0], dp)
    return [grad_fn(params, Xk, yk) for Xk, yk in zip(split_batch(X, sizes), split_batch(y, sizes), strict=True)]


def plain_mean(grads: Sequence) -> object:
    """All-reduce with a plain mean: ``(1/N) sum_k g_k`` (what DDP does).

    Exact (the full-batch gradient) only when every shard has the same size.

    ``grads``: one gradient (array or dict of arrays, same keys) per rank.
    Raises ConfigError on an empty list, dicts with different keys, or gradients
    that are not finite numeric arrays of one shape.
    """
    grads = _check_grads("grads", grads)
    return _map(lambda a: a / len(grads), _sum(grads))


def weighted_mean(grads: Sequence, sizes: Sequence[int] | np.ndarray) -> object:
    """Example-weighted mean ``sum_k n_k g_k / sum_k n_k`` (exact for any shard sizes).

    Raises ConfigError if ``sizes`` and ``grads`` differ in length, a size is not an
    integer >= 1, or the gradients are not as :func:`plain_mean` requires.
    """
    grads, sizes = _check_grads("grads", grads), as_int_list("sizes", sizes, min_value=1)
    if len(grads) != len(sizes):
        raise ConfigError("sizes", sizes, f"must have one positive entry per gradient ({len(grads)})")
    total = sum(sizes)
    return _map(lambda a: a / total, _sum(_map(lambda a, s=s: s * a, g) for g, s in zip(grads, sizes, strict=True)))


def data_parallel_grad(grad_fn: Callable, params: Any, X: ArrayLike, y: ArrayLike, dp: int,
                       weighting: str = "plain") -> object:
    """Gradient as ``dp`` data-parallel ranks compute it.

    ``weighting="plain"``: plain mean of shard gradients (the lesson's
    ``data_parallel_grad``); ``"examples"``: example-weighted mean (the lesson's
    ``data_parallel_grad_weighted``), equal to the full-batch gradient for any
    shard sizes. Raises ConfigError on a bad ``weighting`` or ``dp``.
    """
    check_choice("weighting", weighting, _WEIGHTINGS)
    grads = shard_grads(grad_fn, params, X, y, dp)
    if weighting == "plain":
        return plain_mean(grads)
    return weighted_mean(grads, shard_sizes(np.asarray(X).shape[0], dp))


def plain_mean_bias(grad_sums: Sequence, sizes: Sequence[int]) -> object:
    """Exact error of the plain mean: ``plain_mean - full_gradient``.

    With ``G_k`` the *sum* of per-example gradients in shard ``k`` (``n_k``
    examples, ``N`` shards, ``n = sum n_k``), the plain mean is
    ``sum_k G_k / (N n_k)`` and the full gradient ``sum_k G_k / n``, so

        plain_mean - full = sum_k (1/(N n_k) - 1/n) G_k        (lesson, DP section)

    which vanishes when all ``n_k`` are equal. Coefficients are computed exactly
    (Fractions) and rounded once for float gradients.

    Args: ``grad_sums``: one gradient-sum (array or dict) per shard; ``sizes``:
    ``n_k`` per shard. Raises ConfigError on a length mismatch, a size that is not
    an integer >= 1, or gradient sums that are not as :func:`plain_mean` requires.
    """
    grad_sums, sizes = _check_grads("grad_sums", grad_sums), as_int_list("sizes", sizes, min_value=1)
    if len(grad_sums) != len(sizes):
        raise ConfigError("sizes", sizes, f"must have one positive entry per gradient sum ({len(grad_sums)})")
    N, n = len(sizes), sum(sizes)
    terms = []
    for G, nk in zip(grad_sums, sizes, strict=True):
        coef = Fraction(1, N * nk) - Fraction(1, n)
        terms.append(_map(lambda a, c=coef: _scale_coef(c, a) * a, G))
    return _sum(terms)


def mse_dp_error_bound(w: ArrayLike, X: ArrayLike, y: ArrayLike, dp: int, weighting: str = "plain") -> np.ndarray:
    """Elementwise float64 bound for the DP-vs-full comparison of the MSE gradient.

    Let ``D = data_parallel_grad(mse_grad, w, X, y, dp, weighting)``,
    ``F = mse_grad(w, X, y)`` and ``B = plain_mean_bias([mse_grad_sum(w, X_k, y_k)], sizes)``
    for ``"plain"`` (``B = 0`` for ``"examples"``), all computed in float64.
    In exact arithmetic ``D - F - B = 0``. Returns ``E`` with

        |fl(fl(D - F) - B)| <= E   elementwise.

    Derivation (Higham ch. 3): every quantity is a sum of terms (products of
    inputs and of the constants 2, 1/n_k, 1/N, 1/n, c_k) and along any term's
    path at most ``K = n + d + N + 5`` roundings happen (``d + 1`` for the
    residual, ``n_k`` for ``X_k^T r``, one for each division / coefficient,
    ``N - 1`` for the sum over shards, two for the final subtractions), so the
    computed value is ``sum_t t (1 + theta_t)`` with ``|theta_t| <= gamma_K`` and
    ``|error| <= gamma_K * M`` where ``M`` is the same expression evaluated on
    absolute values. ``M`` is itself computed in float (nonnegative terms, at
    most ``K`` roundings) and so is this formula (3 more), hence the factor
    ``1 / (1 - gamma_{K+3})``.
    Assumes ``w``, ``X``, ``y`` are float64 and no overflow/underflow.

    Args and shapes as :func:`mse_loss` and :func:`data_parallel_grad`; returns
    an array shaped like ``w``. Raises ConfigError on mismatched shapes, ``dp``
    outside ``1..n`` or an unknown ``weighting``.
    """
    check_choice("weighting", weighting, _WEIGHTINGS)
    X, y, w = _check_xy(X, y, w)
    n, d = X.shape
    sizes = shard_sizes(n, dp)
    N = len(sizes)
    absw = np.abs(w)
    parts = [2 * (np.abs(Xk).T @ (np.abs(Xk) @ absw + np.abs(yk)))
             for Xk, yk in zip(split_batch(X, sizes), split_batch(y, sizes), strict=True)]
    m_full = sum(parts) / n
    if weighting == "plain":
        m_dp = sum(p / int(nk) for p, nk in zip(parts, sizes, strict=True)) / N
        m_bias = sum(abs(float(Fraction(1, N * int(nk)) - Fraction(1, n))) * p
                     for p, nk in zip(parts, sizes, strict=True))
    else:
        m_dp = sum(parts) / n
        m_bias = 0.0
    K = n + d + N + 5
    return gamma(K) * (m_dp + m_full + m_bias) / (1 - gamma(K + 3))
