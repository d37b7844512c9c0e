"""Named sympy closed forms with their source, and the catalogue that holds them.

A :class:`ClosedForm` is one formula: a sympy expression in named inputs, the
unit of its result, and where it comes from (paper and equation, or lesson).
``evaluate`` substitutes exact values and returns an exact number (``int`` or
``fractions.Fraction``), so comparisons with references can be bitwise.

The registry is filled by the ``forms`` modules of the parallelism packages
(``distcheck/parallel/<name>/forms.py``), each calling :func:`register` for its
forms. The catalogue, which finds and imports those modules first, is
:func:`distcheck.engine.catalogue.catalogue` (public path: :mod:`distcheck.closed_form`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import sympy as sp

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_choice, check_type

__all__ = ["Input", "ClosedForm", "register", "registered", "INPUT_KINDS"]


#: the kinds of closed-form input (see :class:`Input`)
INPUT_KINDS = ("positive_integer", "nonnegative_integer", "flag", "positive", "nonnegative")


@dataclass(frozen=True)
class Input:
    """One input of a closed form.

    ``kind`` is ``"positive_integer"`` (>= 1), ``"nonnegative_integer"`` (>= 0),
    ``"flag"`` (0 or 1), ``"positive"`` (a positive rational) or ``"nonnegative"``.
    ``default`` is used when the caller leaves the input out (None: required).
    Raises ConfigError for a name that is not a str or a kind not in :data:`INPUT_KINDS`
    (a misspelt kind would otherwise accept any value).
    """

    name: str
    description: str
    unit: str = ""
    kind: str = "positive_integer"
    default: int | Fraction | None = None

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a str naming the input")
        check_choice("kind", self.kind, INPUT_KINDS)

    @property
    def symbol(self) -> sp.Symbol:
        if self.kind in ("positive_integer",):
            return sp.Symbol(self.name, integer=True, positive=True)
        if self.kind in ("nonnegative_integer", "flag"):
            return sp.Symbol(self.name, integer=True, nonnegative=True)
        if self.kind == "positive":
            return sp.Symbol(self.name, positive=True)
        return sp.Symbol(self.name, nonnegative=True)

    def validate(self, value) -> Fraction:
        """Return ``value`` as an exact Fraction, or raise ConfigError naming this input.

        Accepts int, Fraction, Decimal and finite floats (taken at their exact binary
        value, so ``7.5e9`` is 7,500,000,000 and ``0.1`` is not 1/10; pass a Fraction or
        a decimal string to the audit for decimal inputs). Rejects bools and strings.
        """
        if isinstance(value, (bool, str, bytes)):
            raise ConfigError(self.name, value,
                              f"must be a number ({self.kind.replace('_', ' ')}), not {type(value).__name__}")
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            raise ConfigError(self.name, value, "must be a finite number")
        try:
            q = Fraction(value)
        except (TypeError, ValueError, ArithmeticError):
            raise ConfigError(self.name, value, "must be a number") from None
        integral = q.denominator == 1
        if self.kind == "positive_integer" and not (integral and q >= 1):
            raise ConfigError(self.name, value, "must be an integer >= 1")
        if self.kind == "nonnegative_integer" and not (integral and q >= 0):
            raise ConfigError(self.name, value, "must be an integer >= 0")
        if self.kind == "flag" and q not in (0, 1):
            raise ConfigError(self.name, value, "must be 0 or 1")
        if self.kind == "positive" and not q > 0:
            raise ConfigError(self.name, value, "must be > 0")
        if self.kind == "nonnegative" and not q >= 0:
            raise ConfigError(self.name, value, "must be >= 0")
        return q


@dataclass(frozen=True)
class ClosedForm:
    """A named formula.

    Attributes:
        name: dotted catalogue name, ``"<strategy>.<quantity>[.<variant>]"``,
            e.g. ``"pp.bubble_fraction.gpipe"``.
        expr: sympy expression in the symbols of ``inputs``.
        inputs: the named inputs, in a stable order.
        unit: unit of the result: ``"bytes"``, ``"bytes_per_param"``, ``"ticks"``,
            ``"fraction"`` (0..1, not %), ``"params"``, ``"GPUs"``, ``"elements"``, ``"count"``,
            ``"flag"`` (0 or 1).
        source: paper and equation, or lesson and section.
        description: one line saying what the quantity is, with its convention.
        constraints: human-readable side conditions (e.g. "m % p == 0").
    """

    name: str
    expr: sp.Expr
    inputs: tuple[Input, ...]
    unit: str
    source: str
    description: str
    constraints: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a str, e.g. 'pp.bubble_fraction.gpipe'")
        check_type("expr", self.expr, sp.Basic, "must be a sympy expression")
        check_type("inputs", self.inputs, tuple, "must be a tuple of Input")
        for i in self.inputs:
            check_type(f"{self.name} input", i, Input, "must be an Input")
        for f in ("unit", "source", "description"):
            check_type(f, getattr(self, f), str, "must be a str")

    @property
    def symbols(self) -> dict[str, sp.Symbol]:
        return {i.name: i.symbol for i in self.inputs}

    def _values(self, values: Mapping[str, object]) -> dict[str, Fraction]:
        known = {i.name for i in self.inputs}
        for k in values:
            if k not in known:
                raise ConfigError(k, values[k], f"is not an input of {self.name} (inputs: {', '.join(sorted(known))})")
        out = {}
        for i in self.inputs:
            if i.name in values:
                out[i.name] = i.validate(values[i.name])
            elif i.default is not None:
                out[i.name] = Fraction(i.default)
            else:
                raise ConfigError(i.name, None, f"is required by {self.name}")
        return out

    def evaluate(self, **values) -> int | Fraction:
        """Substitute exact values and return an exact ``int`` or ``Fraction``.

        Raises ConfigError for a missing, unknown or out-of-domain input.
        """
        vals = self._values(values)
        subs = {i.symbol: sp.Rational(vals[i.name].numerator, vals[i.name].denominator) for i in self.inputs}
        result = self.expr.subs(subs)
        result = sp.simplify(result) if not result.is_Rational else result
        if not result.is_Rational:
            raise ConfigError(self.name, dict(values), f"does not evaluate to a rational number (got {result})")
        q = Fraction(int(result.p), int(result.q))
        return int(q) if q.denominator == 1 else q

    __call__ = evaluate

    def latex(self) -> str:
        return sp.latex(self.expr)

    def __str__(self) -> str:
        return f"{self.name} = {self.expr}  [{self.unit}]  ({self.source})"


_REGISTRY: dict[str, ClosedForm] = {}


def register(form: ClosedForm) -> ClosedForm:
    """Add ``form`` to the registry; a second form of the same name is an error.
    Raises ConfigError when ``form`` is not a ClosedForm."""
    check_type("form", form, ClosedForm, "must be a ClosedForm")
    if form.name in _REGISTRY and _REGISTRY[form.name] is not form:
        raise ValueError(f"closed form {form.name!r} registered twice")
    _REGISTRY[form.name] = form
    return form


def registered() -> dict[str, ClosedForm]:
    """The forms registered so far, by name (sorted). Only the modules imported so far have
    registered theirs: :func:`distcheck.engine.catalogue.catalogue` imports them all first."""
    return dict(sorted(_REGISTRY.items()))
