"""The lesson's tensor-parallel worked example in exact arithmetic: the numpy references of
:mod:`distcheck.parallel.tp` (split sizes, column and row shards) run on object arrays of Fractions, so
every sum is exact. The tensor-parallel reference (and numpy) is imported only when a worked
example is computed. Sources: the lesson "Scaling and distributed training" (adapted in part
from *AI Engineering from Scratch*), section 3, "Tensor parallelism: columns and rows", and
its exercises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from types import ModuleType
from typing import Any

from distcheck.core.errors import ConfigError

__all__ = ["vector_of", "matrix_of", "vecmat", "column_shard", "row_partial", "swapped_mlp_matches",
           "sliced_activation_matches"]


def _tp() -> ModuleType:
    from distcheck.parallel.tp import reference

    return reference


def _split_sizes(n: int, parts: int) -> list[int]:
    """numpy.array_split sizes: the reference's :func:`distcheck.parallel.tp.split_sizes`."""
    return list(_tp().split_sizes(n, parts))


def matrix_of(values: Mapping[str, Any], name: str) -> list[list[Fraction]]:
    rows = values[name]
    if not rows or any(len(r) != len(rows[0]) for r in rows) or not rows[0]:
        raise ConfigError(name, [list(map(str, r)) for r in rows], "must be a non-empty rectangular matrix")
    return [list(r) for r in rows]


def vector_of(values: Mapping[str, Any], name: str) -> list[Fraction]:
    v = values[name]
    if not v or any(isinstance(x, tuple) for x in v):
        raise ConfigError(name, v, "must be a non-empty vector of numbers")
    return list(v)


def _exact(values: object) -> Any:
    """A vector or matrix of exact numbers as a numpy object array (arithmetic stays exact)."""
    import numpy as np

    return np.array(values, dtype=object)


def _fractions(arr: Any) -> tuple[Fraction, ...]:
    return tuple(Fraction(v) for v in _exact(arr).tolist())


def vecmat(x: list[Fraction], w: list[list[Fraction]]) -> tuple[Fraction, ...]:
    if len(x) != len(w):
        raise ConfigError("x", len(x), f"length must equal the rows of w ({len(w)})")
    return _fractions(_exact(x) @ _exact(w))


def _shard(values: Mapping[str, Any], n: int) -> tuple[int, int]:
    tp, shard = int(values["tp"]), int(values["shard"])
    if tp > n:
        raise ConfigError("tp", tp, f"must be <= the split dimension {n}")
    if shard >= tp:
        raise ConfigError("shard", shard, f"must be < tp={tp}")
    return tp, shard


def column_shard(values: Mapping[str, Any]) -> tuple[Fraction, ...]:
    x, w = vector_of(values, "x"), matrix_of(values, "w")
    vecmat(x, w)  # the shapes must agree
    tp, shard = _shard(values, len(w[0]))
    return _fractions(_tp().column_parallel_parts(_exact(x), _exact(w), tp)[shard])


def row_partial(values: Mapping[str, Any]) -> tuple[Fraction, ...]:
    x, w = vector_of(values, "x"), matrix_of(values, "w")
    vecmat(x, w)
    tp, shard = _shard(values, len(w))
    return _fractions(_tp().row_parallel_parts(_exact(x), _exact(w), tp)[shard])


def _relu(v: Sequence[Fraction]) -> tuple[Fraction, ...]:
    return tuple(max(Fraction(0), a) for a in v)


def swapped_mlp_matches(values: Mapping[str, Any]) -> int:
    """1 if relu(x W1) W2 equals the swapped split (row-split W1, column-split W2, no all-reduce
    before the activation) on this input, else 0."""
    x, w1, w2 = vector_of(values, "x"), matrix_of(values, "w1"), matrix_of(values, "w2")
    tp = int(values["tp"])
    if tp > len(w1) or tp > len(w2[0]):
        raise ConfigError("tp", tp, "must be <= the rows of w1 and the columns of w2")
    full = vecmat(list(_relu(vecmat(x, w1))), w2)
    ref = _tp()
    # rank r: its row shard of W1 (and the matching slice of x), the activation on its PARTIAL sum,
    # then its column shard of W2; the outputs are concatenated (no sum anywhere)
    partials = ref.row_parallel_parts(_exact(x), _exact(w1), tp)
    out: list[Fraction] = []
    for r, partial in enumerate(partials):
        out.extend(_fractions(ref.column_parallel_parts(_exact(_relu(_fractions(partial))), _exact(w2), tp)[r]))
    return 1 if tuple(out) == full else 0


def sliced_activation_matches(values: Mapping[str, Any]) -> int:
    """1 if applying the activation to each column shard of ``h`` and concatenating equals applying
    it to the whole of ``h``, else 0 (exact).

    ``layer_norm = 0``: ReLU, elementwise. ``layer_norm = 1``: layer norm over the hidden dimension
    without affine weights, ``(h - mean(h)) / sqrt(var(h) + eps)`` (population variance, as
    torch.nn.functional.layer_norm). Its values are irrational in general, so they are compared
    exactly as pairs (u, A) meaning u / sqrt(A): equal iff u and w have the same sign and
    u^2 B = w^2 A. The shards are the reference's (:func:`distcheck.parallel.tp.split_bounds` of
    :func:`distcheck.parallel.tp.split_sizes`). Raises ConfigError when a shard's variance plus eps is 0.
    """
    h = vector_of(values, "h")
    tp = int(values["tp"])
    if tp > len(h):
        raise ConfigError("tp", tp, f"must be <= the length of h ({len(h)})")
    norm = int(values.get("layer_norm", 0))
    eps = Fraction(values.get("eps", 0))

    def act(v: Sequence[Fraction]) -> list[tuple[Fraction, Fraction | None]]:
        if not norm:
            return [(a, None) for a in _relu(v)]
        mean = sum(v, Fraction(0)) / len(v)
        var = sum(((a - mean) ** 2 for a in v), Fraction(0)) / len(v) + eps
        if var == 0:
            raise ConfigError("eps", eps, "must be > 0 when a shard of h has zero variance (layer norm divides by it)")
        return [(a - mean, var) for a in v]

    full = act(h)
    sliced: list = []
    for lo, hi in _tp().split_bounds(_split_sizes(len(h), tp)):
        sliced.extend(act(h[lo:hi]))
    if not norm:
        return 1 if full == sliced else 0
    same = all((u > 0) - (u < 0) == (w > 0) - (w < 0) and u * u * b == w * w * a
               for (u, a), (w, b) in zip(full, sliced, strict=True))
    return 1 if same else 0


