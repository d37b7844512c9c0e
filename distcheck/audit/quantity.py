"""One auditable quantity: its inputs, unit, source and exact computation (:class:`Quantity`), and the
helpers that build a quantity from a closed form of the catalogue. The table of every quantity is
:mod:`distcheck.audit.quantities`; the composites beyond the closed forms are there and in
:mod:`distcheck.audit.composites`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from distcheck.audit.constraints import Constraint, declared_for
from distcheck.audit.presets import _PRESET_FIELDS
from distcheck.closed_form import catalogue
from distcheck.core.closed_form import ClosedForm

__all__ = ["QuantityInput", "Quantity", "InputValues", "ExactResult", "Compute"]

#: exact input values by name, each as its input's kind reads it (a Fraction; a tuple of Fractions for
#: a vector, a tuple of such tuples for a matrix; a string for a layout order): the type depends on the
#: name, which no static mapping type states, so the values are ``Any``
InputValues = Mapping[str, Any]

#: what a quantity computes: an exact number, or a tuple of them for an array quantity
ExactResult = int | Fraction | tuple[int | Fraction, ...]


class Compute(Protocol):
    """``compute(values)``: the exact value of a quantity from its input values."""

    def __call__(self, values: InputValues, /) -> ExactResult: ...


@dataclass(frozen=True)
class QuantityInput:
    """One input of an auditable quantity: name, unit, kind (as in closed_form.Input), default."""

    name: str
    description: str
    unit: str = ""
    kind: str = "positive_integer"
    default: int | Fraction | None = None

    def as_dict(self) -> dict:
        d: dict[str, object] = {"name": self.name, "unit": self.unit, "kind": self.kind,
                                "description": self.description}
        d["default"] = None if self.default is None else _jsonable(self.default)
        return d


def _jsonable(x: Any) -> Any:
    if isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
    return x


@dataclass(frozen=True)
class Quantity:
    """An auditable quantity.

    ``compute(values)`` takes exact input values (Fraction, or tuples of them for
    array inputs) and returns an exact int/Fraction (or a tuple for array
    quantities). ``compute`` is None for the not-checkable quantities, whose
    ``reason`` says why. ``array`` marks quantities whose value is a vector.
    ``constraints`` describe side conditions in words; ``requires`` are the executable ones
    (:class:`distcheck.audit.constraints.Constraint`): a claim whose inputs break one is
    ``not-checkable``, naming it. ``convention_inputs`` are inputs ``compute`` does not take, read only
    by the documented conventions of :mod:`distcheck.audit.conventions` (a variant that ``needs`` one)
    and by the unit bridges of :mod:`distcheck.audit.claim_units` (e.g. the world size ``n`` a
    ring-factor reading of an element count needs, and ``bytes_per_element`` for a figure in bytes):
    a claim may give them, the default reading ignores them. ``where`` is ``"path:line"`` of the closed
    form's definition (:attr:`distcheck.core.closed_form.ClosedForm.where`), "" for the audit's own
    quantities (defined in :mod:`distcheck.audit.quantities` and :mod:`distcheck.audit.composites`).
    """

    name: str
    unit: str
    source: str
    description: str
    inputs: tuple[QuantityInput, ...]
    compute: Compute | None
    reason: str | None = None
    array: bool = False
    constraints: tuple[str, ...] = field(default=())
    requires: tuple[Constraint, ...] = field(default=())
    convention_inputs: tuple[QuantityInput, ...] = field(default=())
    where: str = ""

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def convention_input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.convention_inputs)

    def input(self, name: str) -> QuantityInput | None:
        """The input (or convention input) called ``name``; None when the quantity has none."""
        for i in self.inputs + self.convention_inputs:
            if i.name == name:
                return i
        return None

    @property
    def accepts_model(self) -> bool:
        """True when ``model = "<preset>"`` can fill some of the inputs."""
        return bool(set(self.input_names) & (set(_PRESET_FIELDS) | {"params"}))

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.default is None)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "unit": self.unit,
            "source": self.source,
            "description": self.description,
            "inputs": [i.as_dict() for i in self.inputs]
            + ([{"name": "model", "unit": "", "kind": "preset", "default": None,
                 "description": "a preset of distcheck.parallel.params.PRESETS filling the architecture inputs / "
                                "params"}]
               if self.accepts_model else [])
            + _layout_inputs(self.name, self.input_names),
            "convention_inputs": [i.as_dict() for i in self.convention_inputs],
            "checkable": self.compute is not None,
            "reason": self.reason,
            "constraints": list(self.constraints),
            "requires": [c.as_dict() for c in self.requires],
            "where": self.where,
        }


def _layout_inputs(name: str, input_names: tuple[str, ...]) -> list[dict]:
    from distcheck.audit.layout_order import listed_inputs

    return listed_inputs(name, input_names)


def _from_form(form: ClosedForm) -> Quantity:
    def compute(values: InputValues, _f: ClosedForm = form) -> ExactResult:
        return _f.evaluate(**values)

    return Quantity(
        name=form.name, unit=form.unit, source=form.source, description=form.description,
        inputs=tuple(QuantityInput(i.name, i.description, i.unit, i.kind, i.default) for i in form.inputs),
        compute=compute, constraints=tuple(form.constraints),
        requires=declared_for(form.name, tuple(i.name for i in form.inputs)), where=form.where,
    )


def _ev(name: str, **values: Any) -> int | Fraction:
    """Evaluate the closed form ``name`` (exact)."""
    return catalogue()[name].evaluate(**values)


def _form_inputs(name: str, *, drop: tuple[str, ...] = ()) -> tuple[QuantityInput, ...]:
    return tuple(QuantityInput(i.name, i.description, i.unit, i.kind, i.default)
                 for i in catalogue()[name].inputs if i.name not in drop)


def _pick(values: InputValues, names: tuple[str, ...]) -> dict[str, Any]:
    return {k: values[k] for k in names if k in values}
