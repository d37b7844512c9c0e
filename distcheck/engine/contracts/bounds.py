"""Running error bounds: a float64 reference value carried with an elementwise bound on how far
any implementation that follows the same computational model, in a format of unit roundoff u,
can be from the exact value.

Used where the inputs cannot make a result exact (softmax attention). Each operation below
takes its operands' values ``v`` and bounds ``e`` (``|computed - exact| <= e``) and returns the
result's. The model (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §2.2,
§3.1, Lemma 3.1 and Lemma 3.3; the running-error style of §3.3):

* every elementary operation rounds with relative error at most u (``fl(a op b) = (a op b)(1 + d)``,
  ``|d| <= u``); ``exp`` is accurate to 2u (libm and SLEEF are within an ulp; bfloat16 is
  computed in float32 and rounded once);
* a matrix product of inner length k is summed in any order and grouping (including partial
  sums on different ranks, added by an all-reduce), with at most ``EXTRA`` more roundings on
  any term's path (a partial result cast to the storage format, a pre-scaled operand, the
  final cast): ``|fl(A B) - A B| <= gamma_{k+EXTRA} |A||B|``;
* softmax is the stable three-pass form (row max, exponentials and their sum, division). The
  form without the max subtraction has a smaller first-order error (no max to round), and a
  blocked online softmax over a single block is this form.

With ``mag(a) = |a.v| + 2 a.e`` bounding both the exact value and any computed one (the
float64 reference's own error is within its ``e`` for u = 2**-53 <= u), the rules are:

* product: ``e = a.e mag(b) + mag(a) b.e + gamma_{k+EXTRA} mag(a) mag(b)`` (matrix or elementwise, k = 1);
* sum of two: ``e = a.e + b.e + u (|v| + a.e + b.e)``; row sum of n: ``sum e_i + gamma_{n-1+EXTRA} sum mag_i``;
* scaling by a constant c computed with 2 roundings (``1/sqrt(d)``): ``e = |c| (a.e (1 + gamma_2) + gamma_3 mag(a))``,
  and ``|c| a.e`` when c is a power of two (exact);
* exact operands on dyadic grids whose sums stay representable (the bitwise regime of
  :mod:`distcheck.core.exactness`) give an exact product: ``e = 0``;
* row max: ``e = max_j e_j`` (max is exact);
* exp: ``e = exp(v + e_a) (expm1(e_a) + 2u exp(e_a))``; entries masked to -inf are exactly 0;
* division by ``b`` with ``lb = |b.v| - 2 b.e > 0``: ``e = a.e / lb + mag(a) b.e / lb**2 + u mag(a) / lb``.

A result computed in the format of ``u`` differs from the float64 reference value by at most
``e(u) + e(2**-53)`` (:func:`final_bound`), multiplied by ``1 + 2**-30`` for the rounding of the
bound itself: it is evaluated in float64 on nonnegative numbers, each entry through fewer than
2**22 operations, so its relative error is below gamma_{2**22}(2**-53) < 2**-30.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["EXTRA", "UNIT_ROUNDOFF", "Tracked", "gamma", "exact", "matmul", "mul", "add", "sub", "scale", "rowmax",
           "rowsum", "exp", "div", "softmax", "final_bound"]

#: extra roundings allowed on a product's path (partial-result cast, operand pre-scaling, final cast)
EXTRA = 3
#: unit roundoff of each format: 2**-p with p significand bits
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8}
_SELF = 1 + 2.0**-30


def gamma(k: int, u: float) -> float:
    """Higham's gamma_k = k u / (1 - k u) (float; +inf when k u >= 1)."""
    ku = k * u
    return ku / (1 - ku) if ku < 1 else math.inf


@dataclass
class Tracked:
    """A float64 value ``v`` and an elementwise bound ``e`` (same shape) on |computed - exact|."""

    v: np.ndarray
    e: np.ndarray

    @property
    def T(self) -> Tracked:  # numpy's name
        return Tracked(np.swapaxes(self.v, -1, -2), np.swapaxes(self.e, -1, -2))

    def __getitem__(self, idx: Any) -> Tracked:
        return Tracked(self.v[idx], self.e[idx])

    def mag(self) -> np.ndarray:
        return np.abs(self.v) + 2 * self.e


def exact(a: ArrayLike) -> Tracked:
    """An input the format holds exactly: error 0."""
    v = np.asarray(a, dtype=np.float64)
    return Tracked(v, np.zeros_like(v))


def _grid(a: np.ndarray) -> int | None:
    """The least j >= 0 with every entry of ``a`` an integer multiple of 2**-j (None beyond 2**-60)."""
    for j in range(61):
        scaled = a * 2.0**j
        if np.all(scaled == np.round(scaled)):
            return j
    return None


def matmul(a: Tracked, b: Tracked, u: float) -> Tracked:
    """``a @ b`` (inner length k = a's last dim), summed in any order (see the module doc).

    Exact operands on the grids 2**-ja and 2**-jb whose magnitude sums stay within
    2**(p - ja - jb) give an exact product (every partial sum is a representable multiple of
    2**-(ja+jb)): error 0, as in the bitwise regime of :mod:`distcheck.core.exactness`."""
    k = a.v.shape[-1]
    ma, mb = a.mag(), b.mag()
    product = ma @ mb
    if not a.e.any() and not b.e.any():
        ja, jb = _grid(a.v), _grid(b.v)
        p = round(-math.log2(u))
        if ja is not None and jb is not None and (product.max(initial=0.0) <= 2.0 ** (p - ja - jb)):
            return Tracked(a.v @ b.v, np.zeros_like(product))
    return Tracked(a.v @ b.v, a.e @ mb + ma @ b.e + gamma(k + EXTRA, u) * product)


def mul(a: Tracked, b: Tracked, u: float) -> Tracked:
    """Elementwise ``a * b`` (broadcasting)."""
    ma, mb = a.mag(), b.mag()
    return Tracked(a.v * b.v, a.e * mb + ma * b.e + u * ma * mb)


def add(a: Tracked, b: Tracked, u: float) -> Tracked:
    """Elementwise ``a + b`` (broadcasting)."""
    v = a.v + b.v
    e = a.e + b.e
    return Tracked(v, e + u * (np.abs(v) + e))


def sub(a: Tracked, b: Tracked, u: float) -> Tracked:
    return add(a, Tracked(-b.v, b.e), u)


def scale(a: Tracked, c: float, u: float) -> Tracked:
    """``a * c`` for a constant c computed with two roundings (e.g. ``1 / sqrt(head_dim)``);
    a power of two (head_dim 1, 4, 16...) is exact however it is computed, and so is the product."""
    if c > 0 and math.frexp(c)[0] == 0.5:
        return Tracked(a.v * c, abs(c) * a.e)
    return Tracked(a.v * c, abs(c) * (a.e * (1 + gamma(2, u)) + gamma(3, u) * a.mag()))


def rowmax(a: Tracked) -> Tracked:
    """Max over the last axis (exact: the max of perturbed entries moves by at most the largest perturbation)."""
    return Tracked(a.v.max(axis=-1, keepdims=True), a.e.max(axis=-1, keepdims=True))


def rowsum(a: Tracked, u: float) -> Tracked:
    """Sum over the last axis, any order."""
    n = a.v.shape[-1]
    rounding = gamma(max(n - 1, 0) + EXTRA, u) * a.mag().sum(axis=-1, keepdims=True)
    return Tracked(a.v.sum(axis=-1, keepdims=True), a.e.sum(axis=-1, keepdims=True) + rounding)


def exp(a: Tracked, u: float) -> Tracked:
    """Elementwise exp; entries equal to -inf (masked) give exactly 0."""
    masked = np.isneginf(a.v)
    v = np.where(masked, 0.0, np.exp(np.where(masked, 0.0, a.v)))
    ea = np.where(masked, 0.0, a.e)
    e = np.exp(np.where(masked, 0.0, a.v) + ea) * (np.expm1(ea) + 2 * u * np.exp(ea))
    return Tracked(v, np.where(masked, 0.0, e))


def div(a: Tracked, b: Tracked, u: float) -> Tracked:
    """Elementwise ``a / b`` (broadcasting). ``b`` must stay away from 0: ``|b.v| - 2 b.e > 0``;
    otherwise the bound is infinite (no claim can be made)."""
    lb = np.abs(b.v) - 2 * b.e
    with np.errstate(divide="ignore", invalid="ignore"):
        ma = a.mag()
        e = np.where(lb > 0, a.e / lb + ma * b.e / lb**2 + u * ma / lb, np.inf)
    return Tracked(a.v / b.v, e)


def softmax(s: Tracked, u: float) -> Tracked:
    """Stable softmax over the last axis: ``exp(s - max) / sum``; -inf entries are masked keys."""
    m = rowmax(Tracked(np.where(np.isneginf(s.v), -np.inf, s.v), s.e))
    z = Tracked(np.where(np.isneginf(s.v), -np.inf, s.v - m.v),
                np.where(np.isneginf(s.v), 0.0, s.e + m.e + u * (np.abs(s.v - m.v) + s.e + m.e)))
    ex = exp(z, u)
    return div(ex, rowsum(ex, u), u)


def final_bound(low: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Bound on |result in the format - float64 reference|: ``(e(u) + e(2**-53)) (1 + 2**-30)``."""
    return (low + ref) * _SELF
