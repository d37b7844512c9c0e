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

import linecache
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import FrameType
from typing import Any

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

    def validate(self, value: Any) -> Fraction:
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
        module, file, line: where the form is defined, captured when it is built: the module of the
            first caller outside this one, its source file, and the line of that file that spells the
            form's name (the line a grep of the name finds), else the line of the call.
            :attr:`where` is ``"path:line"``, the path relative to the checkout (or site-packages).
    """

    name: str
    expr: sp.Expr
    inputs: tuple[Input, ...]
    unit: str
    source: str
    description: str
    constraints: tuple[str, ...] = field(default=())
    module: str = field(default="", compare=False)
    file: str = field(default="", compare=False, repr=False)
    line: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a str, e.g. 'pp.bubble_fraction.gpipe'")
        check_type("expr", self.expr, sp.Basic, "must be a sympy expression")
        check_type("inputs", self.inputs, tuple, "must be a tuple of Input")
        for i in self.inputs:
            check_type(f"{self.name} input", i, Input, "must be an Input")
        for f in ("unit", "source", "description"):
            check_type(f, getattr(self, f), str, "must be a str")
        if not self.module:
            module, file, line = _definition(self.name)
            object.__setattr__(self, "module", module)
            object.__setattr__(self, "file", file)
            object.__setattr__(self, "line", line)

    @property
    def where(self) -> str:
        """``"path:line"`` of the definition (``distcheck/parallel/pp/forms.py:121``): the path relative to the
        folder holding the ``distcheck`` package, so that it opens from a checkout's root."""
        root = Path(__file__).resolve().parent.parent.parent
        path = Path(self.file)
        try:
            path = path.resolve().relative_to(root)
        except ValueError:
            pass
        return f"{path}:{self.line}"

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

    def evaluate(self, **values: Any) -> int | Fraction:
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


def _definition(name: str) -> tuple[str, str, int]:
    """(module, file, line) of the code building the form called ``name``: the first frame outside this module
    (and outside the dataclass' generated ``__init__``); the line is the first of that file that spells
    ``name`` as a string literal, else the first comment naming it (the forms a loop builds), else the
    frame's own line."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename in (__file__, "<string>")):
        frame = frame.f_back
    if frame is None:  # pragma: no cover - built from nowhere
        return "", "", 0
    file = frame.f_code.co_filename
    lines = linecache.getlines(file)
    literal = re.compile(rf"[\"']{re.escape(name)}[\"']")
    comment = re.compile(rf"#.*(?<![\w.]){re.escape(name)}(?![\w.])")
    line = next((i for i, text in enumerate(lines, 1) if literal.search(text)), None)
    line = line or next((i for i, text in enumerate(lines, 1) if comment.search(text)), frame.f_lineno)
    return str(frame.f_globals.get("__name__", "")), file, line


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
