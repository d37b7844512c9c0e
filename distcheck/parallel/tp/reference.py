"""Tensor parallelism, reference implementation (numpy, pure functions).

A linear layer ``y = x W`` (``W`` of shape (d_in, d_out)) is split over ``tp``
ranks in one of two ways (lesson, "Tensor parallelism: columns and rows";
Shoeybi et al. 2019, Megatron-LM, section 3):

* **column-parallel**: rank ``r`` holds columns ``W[:, cols_r]`` and computes
  ``x W[:, cols_r]``; outputs are concatenated (an all-gather, or nothing if
  the next layer consumes the shards). No sum, so each output element is the
  same inner product as in the full matmul.
* **row-parallel**: rank ``r`` holds rows ``W[rows_r, :]`` and the matching
  slice ``x[..., rows_r]``; partial products are summed (one all-reduce). The
  bias is added once, after the reduce.

Splits follow ``np.array_split``: shards may be uneven (the first
``n % tp`` ranks get one extra column/row).

Exactness
---------
* Integer-valued float64 inputs whose partial sums all stay below ``2**53`` in
  magnitude: every result here is exact, hence bitwise equal to the full matmul.
* Otherwise column-parallel and the full matmul each satisfy
  ``|computed - exact| <= gamma_{d_in} |x| |W|`` (Higham, Accuracy and Stability
  of Numerical Algorithms, eq. 3.5); BLAS may block a column slice differently
  from the full matrix, so bitwise equality is typical but NOT guaranteed.
* Row-parallel reorders the sum over ``d_in``; :func:`row_parallel_error_bound`
  gives the bound on its difference from the full matmul.

Collective log: functions taking ``log`` append one ``("all_reduce", shape)``
tuple per all-reduce they model, so a property can count collectives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import (
    MAX_RANKS,
    as_array,
    as_arrays,
    as_int_list,
    check_at_most,
    check_choice,
    check_positive_int,
    check_type,
)
from distcheck.core.vocab import Collective
from distcheck.parallel.dp.reference import UNIT_ROUNDOFF, gamma  # one float gamma, wrapping exactness.gamma

__all__ = [
    "UNIT_ROUNDOFF",
    "gamma",
    "ACTIVATIONS",
    "activation",
    "split_sizes",
    "split_bounds",
    "column_parallel_parts",
    "column_parallel",
    "column_parallel_error_bound",
    "row_parallel_parts",
    "row_parallel",
    "row_parallel_error_bound",
    "mlp",
    "megatron_mlp",
    "silu",
    "swiglu_mlp",
    "tp_swiglu_mlp",
    "shard_fused_gate_up",
    "tp_swiglu_mlp_fused",
    "layer_norm",
    "sharded_layer_norm",
]

#: elementwise activations accepted by :func:`megatron_mlp`
ACTIVATIONS = ("relu", "gelu", "tanh", "silu")

_erf = np.vectorize(math.erf, otypes=[float])


def silu(z: ArrayLike) -> np.ndarray:
    """SiLU / swish: ``z * sigmoid(z) = z / (1 + exp(-z))`` (Elfwing et al. 2018).

    Raises ConfigError unless ``z`` is a finite numeric array (or number)."""
    z = as_array("z", z, allow_empty=True, allow_object=False, allow_bool=False)
    return z / (1 + np.exp(-z))


def activation(name: str, z: ArrayLike) -> np.ndarray:
    """Apply the elementwise activation ``name`` (one of :data:`ACTIVATIONS`).

    ``gelu`` is the exact erf form ``z * (1 + erf(z / sqrt 2)) / 2`` (Hendrycks
    & Gimpel 2016, eq. 1), not the tanh approximation.
    Raises ConfigError on an unknown name.
    """
    check_choice("act", name, ACTIVATIONS)
    z = as_array("z", z, allow_empty=True, allow_object=False, allow_bool=False)
    if name == "relu":
        return np.maximum(z, 0)
    if name == "tanh":
        return np.tanh(z)
    if name == "silu":
        return silu(z)
    return z * (1 + _erf(z / math.sqrt(2))) / 2


# ----------------------------------------------------------------------------- splits


def _sizes(n: int, tp: int, what: str) -> list[int]:
    tp = check_positive_int("tp", tp)
    if n < tp:
        raise ConfigError("tp", tp, f"must be <= {what}={n} (every shard needs at least one)")
    base, extra = divmod(n, tp)
    return [base + 1] * extra + [base] * (tp - extra)


def split_sizes(n: int, shards: int) -> list[int]:
    """Sizes of ``np.array_split(range(n), shards)``: ``split_sizes(10, 4) -> [3, 3, 2, 2]``.

    Raises ConfigError unless ``n >= shards >= 1`` (integers) and ``shards <= MAX_RANKS``
    (2**24, :data:`distcheck.core.validate.MAX_RANKS`).
    """
    n = check_positive_int("n", n)
    shards = check_positive_int("shards", shards)
    check_at_most("shards", shards, MAX_RANKS, "one size is listed per shard")
    if n < shards:
        raise ConfigError("shards", shards, f"must be <= n={n} (every shard needs at least one)")
    return _sizes(n, shards, "n")


def split_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of consecutive shards of the given sizes.

    Raises ConfigError unless ``sizes`` is a list of integers >= 0."""
    out, start = [], 0
    for s in as_int_list("sizes", sizes, min_value=0, min_len=0):
        out.append((start, start + s))
        start += s
    return out


def _check_log(log: object) -> None:
    if log is not None:
        check_type("log", log, list, "must be a list (collectives are appended to it) or None")


def _check_linear(x: ArrayLike, W: ArrayLike, b: ArrayLike | None, x_name: str = "x", W_name: str = "W",
                  b_name: str = "b") -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """x (..., d_in), W (d_in, d_out), b (d_out,) or None: finite, numeric, non-empty."""
    x, W = as_array(x_name, x, min_ndim=1), as_array(W_name, W)
    if W.ndim != 2:
        raise ConfigError(f"{W_name}.shape", W.shape, "must be (d_in, d_out)")
    if x.shape[-1] != W.shape[0]:
        raise ConfigError(f"{x_name}.shape", x.shape, f"must end with d_in={W.shape[0]} (rows of {W_name})")
    if b is not None:
        b = as_array(b_name, b)
        if b.shape != (W.shape[1],):
            raise ConfigError(f"{b_name}.shape", b.shape, f"must be ({W.shape[1]},) (columns of {W_name})")
    return x, W, b


# ----------------------------------------------------------------------------- column / row


def column_parallel_parts(x: ArrayLike, W: ArrayLike, tp: int, b: ArrayLike | None = None) -> list[np.ndarray]:
    """Per-rank outputs ``x @ W[:, cols_r] (+ b[cols_r])`` of a column-parallel linear.

    Args: ``x`` (..., d_in); ``W`` (d_in, d_out); ``b`` (d_out,) or None, sharded
    with the columns. Raises ConfigError on shape mismatch or ``tp > d_out``.
    """
    x, W, b = _check_linear(x, W, b)
    out = []
    for lo, hi in split_bounds(_sizes(W.shape[1], tp, "output_cols")):
        y = x @ W[:, lo:hi]
        out.append(y if b is None else y + b[lo:hi])
    return out


def column_parallel(x: ArrayLike, W: ArrayLike, tp: int, b: ArrayLike | None = None) -> np.ndarray:
    """Column-parallel linear: concatenation of :func:`column_parallel_parts` (..., d_out).

    Exact for integer-valued inputs (see module docstring); for general floats
    within :func:`column_parallel_error_bound` of ``x @ W (+ b)``.
    """
    return np.concatenate(column_parallel_parts(x, W, tp, b), axis=-1)


def _abs_product(x: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    m = np.abs(x) @ np.abs(W)
    return m if b is None else m + np.abs(b)


def column_parallel_error_bound(x: ArrayLike, W: ArrayLike, b: ArrayLike | None = None) -> np.ndarray:
    """Elementwise bound on ``|column_parallel(x, W, tp, b) - (x @ W + b)|`` in float64.

    Both sides compute each output element as an inner product of length
    ``d_in`` (plus one addition for the bias) in some order, so each is within
    ``gamma_k |x||W| (+|b|)`` of the exact value, ``k = d_in (+1)``; the bound is
    twice that, divided by ``1 - gamma_{k+3}`` because ``|x||W|`` is itself rounded
    (k roundings) and so is the formula (3 more). Independent of ``tp``.

    Args: ``x`` (..., d_in), ``W`` (d_in, d_out), ``b`` (d_out,) or None; returns
    (..., d_out). Raises ConfigError on mismatched shapes.
    """
    x, W, b = _check_linear(x, W, b)
    k = W.shape[0] + (b is not None)
    return 2 * gamma(k) * _abs_product(x, W, b) / (1 - gamma(k + 3))


def row_parallel_parts(x: ArrayLike, W: ArrayLike, tp: int) -> list[np.ndarray]:
    """Per-rank partial sums ``x[..., rows_r] @ W[rows_r, :]`` of a row-parallel linear.

    Args: ``x`` (..., d_in); ``W`` (d_in, d_out). Raises ConfigError on shape
    mismatch or ``tp > d_in``.
    """
    x, W, _ = _check_linear(x, W, None)
    return [x[..., lo:hi] @ W[lo:hi, :] for lo, hi in split_bounds(_sizes(W.shape[0], tp, "input_rows"))]


def row_parallel(x: ArrayLike, W: ArrayLike, tp: int, b: ArrayLike | None = None, *,
                 log: list | None = None) -> np.ndarray:
    """Row-parallel linear: all-reduce (sum, in rank order) of the partials, then ``+ b`` once.

    Adding the bias on every rank before the reduce would add it ``tp`` times.
    Args as :func:`row_parallel_parts`; ``b`` (d_out,) or None. Appends one
    ``("all_reduce", shape)`` to ``log`` when given.

    Raises ConfigError on mismatched shapes, ``tp > d_in`` or a ``log`` that is not a list.
    """
    _check_log(log)
    x, W, b = _check_linear(x, W, b)
    parts = row_parallel_parts(x, W, tp)
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    if log is not None:
        log.append((Collective.ALL_REDUCE, out.shape))
    return out if b is None else out + b


def row_parallel_error_bound(x: ArrayLike, W: ArrayLike, tp: int, b: ArrayLike | None = None) -> np.ndarray:
    """Elementwise bound on ``|row_parallel(x, W, tp, b) - (x @ W + b)|`` in float64.

    The full matmul rounds each output along a path of at most ``d_in`` operations
    (one product, ``d_in - 1`` additions, any order); the row-parallel result
    along at most ``max_r d_r + tp - 1`` (a shard's inner product, then ``tp - 1``
    additions of partials); the bias adds one. With ``k`` the larger count,
    each side is within ``gamma_k (|x||W| + |b|)`` of the exact value (Higham,
    eq. 3.5 / Lemma 3.3), so their difference is within

        2 gamma_k (|x||W| + |b|) / (1 - gamma_{d_in + 4})

    where the last factor covers the rounding in computing ``|x||W| + |b|``
    (at most ``d_in + 1`` roundings) and in evaluating this formula (3 more).
    Raises ConfigError as :func:`row_parallel_parts`.
    """
    x, W, b = _check_linear(x, W, b)
    d_in = W.shape[0]
    sizes = _sizes(d_in, tp, "input_rows")
    k = max(d_in, max(sizes) + tp - 1) + (b is not None)
    return 2 * gamma(k) * _abs_product(x, W, b) / (1 - gamma(d_in + 4))


# ----------------------------------------------------------------------------- MLPs


def mlp(x: ArrayLike, W_up: ArrayLike, W_down: ArrayLike, act: str = "relu", b_up: ArrayLike | None = None,
        b_down: ArrayLike | None = None) -> np.ndarray:
    """Single-device MLP ``act(x W_up + b_up) W_down + b_down``.

    Shapes: ``x`` (..., d), ``W_up`` (d, ffn), ``W_down`` (ffn, d_out),
    ``b_up`` (ffn,), ``b_down`` (d_out,).

    Raises ConfigError on mismatched shapes or an unknown ``act``.
    """
    x, W_up, b_up = _check_linear(x, W_up, b_up, "x", "W_up", "b_up")
    check_choice("act", act, ACTIVATIONS)
    _check_linear(np.zeros(W_up.shape[1:]), W_down, b_down, "hidden", "W_down", "b_down")
    h = x @ W_up
    h = activation(act, h if b_up is None else h + b_up)
    h, W_down, b_down = _check_linear(h, W_down, b_down, "hidden", "W_down", "b_down")
    y = h @ W_down
    return y if b_down is None else y + b_down


def megatron_mlp(x: ArrayLike, W_up: ArrayLike, W_down: ArrayLike, tp: int, act: str = "relu",
                 b_up: ArrayLike | None = None, b_down: ArrayLike | None = None, *,
                 log: list | None = None) -> np.ndarray:
    """Megatron-LM tensor-parallel MLP (Shoeybi et al. 2019, section 3, Fig. 3a; lesson).

    ``W_up`` is column-split, the activation is applied to each rank's hidden
    slice locally (valid because it is elementwise), ``W_down`` is row-split
    with the same ``ffn`` shards, and ONE all-reduce sums the partials; ``b_down``
    is added once after it. Any ``tp <= ffn`` works, including uneven splits.

    Result: bitwise equal to ``row_parallel(act(column_parallel(x, W_up, tp, b_up)),
    W_down, tp, b_down)``; exact (equal to :func:`mlp`) for integer-valued inputs
    with ``act="relu"``; in general the reduce step is within
    :func:`row_parallel_error_bound` of the single-device product.
    Raises ConfigError on shape mismatch, ``tp > ffn`` or an unknown ``act``.
    """
    _check_log(log)
    check_choice("act", act, ACTIVATIONS)
    x, W_up, b_up = _check_linear(x, W_up, b_up, "x", "W_up", "b_up")
    W_down = as_array("W_down", W_down)
    if W_down.ndim != 2 or W_down.shape[0] != W_up.shape[1]:
        raise ConfigError("W_down.shape", W_down.shape,
                          f"must start with ffn={W_up.shape[1]} (columns of W_up) and be 2-D (ffn, d_out)")
    h_parts = [activation(act, h) for h in column_parallel_parts(x, W_up, tp, b_up)]  # local, no comm
    h = np.concatenate(h_parts, axis=-1)
    return row_parallel(h, W_down, tp, b_down, log=log)


def swiglu_mlp(x: ArrayLike, W_gate: ArrayLike, W_up: ArrayLike, W_down: ArrayLike) -> np.ndarray:
    """SwiGLU MLP ``(silu(x W_gate) * (x W_up)) W_down`` (Shazeer 2020, eq. 6; Llama).

    Shapes: ``x`` (..., d), ``W_gate`` and ``W_up`` (d, ffn), ``W_down`` (ffn, d_out).

    Raises ConfigError on mismatched shapes.
    """
    x, W_gate, _ = _check_linear(x, W_gate, None, "x", "W_gate")
    W_up = as_array("W_up", W_up)
    if W_up.shape != W_gate.shape:
        raise ConfigError("W_up.shape", W_up.shape, f"must equal W_gate.shape={W_gate.shape}")
    _, W_down, _ = _check_linear(np.zeros(W_gate.shape[1:]), W_down, None, "hidden", "W_down")
    h = silu(x @ W_gate) * (x @ W_up)
    return h @ W_down


def tp_swiglu_mlp(x: ArrayLike, W_gate: ArrayLike, W_up: ArrayLike, W_down: ArrayLike, tp: int, *,
                  log: list | None = None) -> np.ndarray:
    """Tensor-parallel SwiGLU: gate and up column-split with the SAME ffn shards,
    the product ``silu(g_r) * u_r`` formed locally, ``W_down`` row-split, one all-reduce.

    Same exactness statement as :func:`megatron_mlp` (the reduce step is within
    :func:`row_parallel_error_bound`). Raises ConfigError on shape mismatch or
    ``tp > ffn``.
    """
    _check_log(log)
    x, W_gate, _ = _check_linear(x, W_gate, None, "x", "W_gate")
    W_up = as_array("W_up", W_up)
    if W_up.shape != W_gate.shape:
        raise ConfigError("W_up.shape", W_up.shape, f"must equal W_gate.shape={W_gate.shape}")
    W_down = as_array("W_down", W_down)
    if W_down.ndim != 2 or W_down.shape[0] != W_gate.shape[1]:
        raise ConfigError("W_down.shape", W_down.shape,
                          f"must start with ffn={W_gate.shape[1]} and be 2-D (ffn, d_out)")
    g_parts = column_parallel_parts(x, W_gate, tp)
    u_parts = column_parallel_parts(x, W_up, tp)
    h = np.concatenate([silu(g) * u for g, u in zip(g_parts, u_parts, strict=True)], axis=-1)
    return row_parallel(h, W_down, tp, log=log)


def shard_fused_gate_up(W_fused: ArrayLike, tp: int) -> list[np.ndarray]:
    """Shard a fused gate/up weight for tensor parallelism.

    Layout: ``W_fused`` has shape (d, 2 ffn) with the gate projection in the
    first ``ffn`` output columns and the up projection in the last ``ffn``:
    ``[gate | up]`` along the output dim. Rank ``r`` must get ``[gate_r | up_r]``
    with ``gate_r`` and ``up_r`` the SAME ffn slice. A naive
    ``np.array_split(W_fused, tp, axis=1)`` instead hands rank 0 only gate
    columns (for even ``tp``) and pairs gate and up of different hidden units.

    Returns one (d, 2 ffn_r) array per rank, ``ffn_r`` from :func:`split_sizes`.
    Raises ConfigError if the output dim is odd or ``tp > ffn``.
    """
    W = as_array("W_fused", W_fused)
    if W.ndim != 2 or W.shape[1] % 2:
        raise ConfigError("W_fused.shape", W.shape, "must be (d, 2 * ffn) with layout [gate | up]")
    ffn = W.shape[1] // 2
    gate, up = W[:, :ffn], W[:, ffn:]
    return [np.concatenate([gate[:, lo:hi], up[:, lo:hi]], axis=1) for lo, hi in split_bounds(_sizes(ffn, tp, "ffn"))]


def tp_swiglu_mlp_fused(x: ArrayLike, W_fused: ArrayLike, W_down: ArrayLike, tp: int, *,
                        log: list | None = None) -> np.ndarray:
    """:func:`tp_swiglu_mlp` with a fused ``[gate | up]`` weight sharded by
    :func:`shard_fused_gate_up`; each rank splits its local shard in half.

    Equal to ``swiglu_mlp(x, W_fused[:, :ffn], W_fused[:, ffn:], W_down)`` up to
    the row-parallel reduce bound.

    Shapes: ``x`` (..., d), ``W_fused`` (d, 2 ffn) laid out ``[gate | up]``,
    ``W_down`` (ffn, d_out). Raises ConfigError on mismatched shapes, an odd
    output dim of ``W_fused`` or ``tp > ffn``.
    """
    _check_log(log)
    x = as_array("x", x, min_ndim=1)
    shards = shard_fused_gate_up(W_fused, tp)
    W_fused = np.asarray(W_fused)
    ffn = W_fused.shape[1] // 2
    W_down = as_array("W_down", W_down)
    if W_down.ndim != 2 or W_down.shape[0] != ffn:
        raise ConfigError("W_down.shape", W_down.shape, f"must start with ffn={ffn} and be 2-D (ffn, d_out)")
    if x.shape[-1] != W_fused.shape[0]:
        raise ConfigError("x.shape", x.shape, f"must end with d={W_fused.shape[0]}")
    h_parts = []
    for S in shards:
        half = S.shape[1] // 2
        gu = x @ S
        h_parts.append(silu(gu[..., :half]) * gu[..., half:])
    return row_parallel(np.concatenate(h_parts, axis=-1), W_down, tp, log=log)


def _check_eps(eps: object) -> None:
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (int, float, np.integer, np.floating)) \
            or not np.isfinite(eps) or eps < 0:
        raise ConfigError("eps", eps, "must be a finite number >= 0")


def layer_norm(h: ArrayLike, eps: float = 0.0) -> np.ndarray:
    """Layer norm over the last dim, no affine: ``(h - mean) / sqrt(var + eps)``.

    Not elementwise: it needs the mean and variance of the whole hidden vector,
    so applying it to each rank's hidden slice (as Megatron does with the
    activation) gives a different result; it needs an extra all-reduce of the
    statistics (lesson, "Predict" question after tp_mlp).

    Args: ``h`` (..., hidden), finite, hidden >= 1; ``eps`` a finite number >= 0.
    Raises ConfigError otherwise, or when ``eps == 0`` and a row of ``h`` is
    constant (its variance is 0: the result would be 0/0 = NaN).
    """
    h = as_array("h", h, min_ndim=1, allow_object=False)
    _check_eps(eps)
    mu = h.mean(axis=-1, keepdims=True)
    var = ((h - mu) ** 2).mean(axis=-1, keepdims=True)
    if eps == 0 and np.any(var == 0):
        raise ConfigError("eps", eps, "must be > 0 when a row of h is constant (its variance is 0; 0/0 is NaN)")
    return (h - mu) / np.sqrt(var + eps)


def sharded_layer_norm(x_shards: Sequence[ArrayLike], eps: float = 1.0) -> list[np.ndarray]:
    """Layer norm of a hidden dim sharded over ranks, no affine: one slice per rank in, one out.

    The statistics need the whole row: one all-reduce of the partial sums gives the
    mean, a second of the partial sums of squared deviations gives the variance, then
    each rank normalises its own slice (the fix of the lesson's "Predict" question after
    tp_mlp). Their concatenation is :func:`layer_norm` of the whole row (bit for bit for a
    hidden size that is a power of two and integer inputs: ``tp.layer_norm.sharded_hidden``).

    Args: ``x_shards``, a non-empty list of finite numeric arrays (..., h_r) sharing their
    leading shape (rank r's slice of the hidden dim); ``eps`` a finite number >= 0.
    Returns the list of normalised slices, shaped as the inputs.
    Raises ConfigError otherwise, or when ``eps == 0`` and a row is constant (0/0).
    """
    shards = as_arrays("x_shards", x_shards, min_ndim=1, allow_object=False, allow_bool=False)
    _check_eps(eps)
    lead = shards[0].shape[:-1]
    for i, s in enumerate(shards[1:], start=1):
        if s.shape[:-1] != lead:
            raise ConfigError(f"x_shards[{i}].shape", s.shape, f"must start with {lead} (as x_shards[0])")
    n = sum(s.shape[-1] for s in shards)
    total = shards[0].sum(axis=-1, keepdims=True)
    for s in shards[1:]:
        total = total + s.sum(axis=-1, keepdims=True)  # all-reduce
    mean = total / n
    sq = ((shards[0] - mean) ** 2).sum(axis=-1, keepdims=True)
    for s in shards[1:]:
        sq = sq + ((s - mean) ** 2).sum(axis=-1, keepdims=True)  # all-reduce
    if eps == 0 and np.any(sq == 0):
        raise ConfigError("eps", eps, "must be > 0 when a row is constant (its variance is 0; 0/0 is NaN)")
    std = np.sqrt(sq / n + eps)
    return [(s - mean) / std for s in shards]
