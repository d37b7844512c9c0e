"""Exact values of the audit's quantities and how a printed figure is compared with them: a value in a claim's
unit, whether it lies within half the figure's rounding step, its distance, and its printed form. Shared by
:mod:`distcheck.audit.verdict` and :mod:`distcheck.audit.contradictions`."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, TypeGuard

from distcheck.audit import quantities as qmod
from distcheck.audit.claim_units import factor_across
from distcheck.audit.counts import is_whole_unit
from distcheck.audit.numbers import format_exact
from distcheck.audit.quantity import InputValues
from distcheck.core.errors import ConfigError

__all__ = ["Exact"]

#: an exact recomputed value: a Fraction, or a tuple of them for an array quantity
Exact = Fraction | tuple[Fraction, ...]


def _in_unit(value: Exact, quantity_unit: str, unit: str, around: InputValues | None = None) -> Exact:
    f = factor_across(quantity_unit, unit, around or {})
    if isinstance(value, tuple):
        return tuple(Fraction(v) / f for v in value)
    return Fraction(value) / f


def _matches(value_in_unit: Exact, claimed: Any, step: Fraction) -> bool:
    half = step / 2
    if isinstance(value_in_unit, tuple) or isinstance(claimed, tuple):
        if not (isinstance(value_in_unit, tuple) and isinstance(claimed, tuple)) or len(value_in_unit) != len(claimed):
            return False
        return all(abs(a - b) <= half for a, b in zip(value_in_unit, claimed, strict=True))
    return abs(Fraction(value_in_unit) - claimed) <= half


def _not_whole(value: Exact, quantity_unit: str) -> TypeGuard[Fraction]:
    """A count of whole things (distcheck.audit.counts) computed as a fraction (never a vector)."""
    return not isinstance(value, tuple) and is_whole_unit(quantity_unit) and Fraction(value).denominator != 1


def _fmt(value: Any, unit: str = "") -> str:
    if unit == "flag" and not isinstance(value, tuple) and value in (0, 1):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(format_exact(v, 6) for v in value) + "]" + (f" {unit}" if unit else "")
    return format_exact(value, 9) + (f" {unit}" if unit else "")


def _distance(value_in_unit: Exact, claimed: Any) -> Fraction:
    if isinstance(value_in_unit, tuple):
        if not isinstance(claimed, tuple) or len(claimed) != len(value_in_unit):
            return Fraction(10) ** 80
        return max(abs(a - b) for a, b in zip(value_in_unit, claimed, strict=True))
    return abs(Fraction(value_in_unit) - claimed)


def _compute(q: qmod.Quantity, values: InputValues) -> Exact:
    """Exact value; ConfigError (and arithmetic errors) propagate as ConfigError, as does a quantity
    without a closed form."""
    if q.compute is None:
        raise ConfigError(q.name, {k: str(v) for k, v in values.items()}, "has no closed form to evaluate")
    full = {i.name: Fraction(i.default) for i in q.inputs if i.default is not None}
    full.update(values)
    try:
        out = q.compute(full)
    except ConfigError:
        raise
    except (ArithmeticError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(q.name, {k: str(v) for k, v in values.items()},
                          f"cannot be evaluated ({type(exc).__name__}: {exc})") from None
    if isinstance(out, tuple):
        return tuple(Fraction(v) for v in out)
    return Fraction(out)


def _value_in(q: qmod.Quantity, values: InputValues, unit: str) -> Fraction:
    """The exact value of ``q`` at ``values`` in ``unit`` (a number: rounded_inputs skips vectors)."""
    return Fraction(_in_unit(_compute(q, values), q.unit, unit))  # type: ignore[arg-type]
