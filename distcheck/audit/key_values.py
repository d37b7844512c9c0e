"""The values of an answer key: exact numbers from TOML literals and printed strings, the inputs
of a quantity checked against their domains, claimed figures with their units. Every problem is
an :class:`~distcheck.core.errors.AnswerKeyError` naming the file, the line and the field."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from types import ModuleType
from typing import TYPE_CHECKING, Any

from distcheck.audit.numbers import PrintedNumber, parse_printed
from distcheck.core.errors import AnswerKeyError
from distcheck.core.validate import check_type

if TYPE_CHECKING:
    from distcheck.audit.quantity import Quantity, QuantityInput

__all__ = ["parse_input_string", "input_step", "ROUNDED_INPUT_KINDS"]

_MAX_ARRAY = 4096
_MAX_ELEMENTS = 65536  # a matrix input holds at most this many numbers (exact arithmetic is O(rows x cols))
_MAX_ABS = Fraction(10) ** 60  # inputs and figures beyond this are refused, not computed
_WITH_UNIT = re.compile(r"^\s*(?P<num>[^A-Za-z%]+?)\s*(?P<unit>[A-Za-z%][A-Za-z/%_ -]*)?\s*$")


def _err(msg: str, path: str | None, line: int | None, fld: str | None) -> AnswerKeyError:
    # a field named by a quoted TOML key may hold a newline or another control character: escape
    # it, so that every error stays one line
    if isinstance(fld, str) and not fld.isprintable():
        fld = repr(fld)[1:-1]
    return AnswerKeyError(msg, path=path, line=line, field=fld)


def _is_number(x: object) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or isinstance(x, float)


def _exact_float(x: float) -> Fraction:
    # the shortest decimal that round-trips is what the author typed (or equivalent)
    return Fraction(repr(x))


def _finite(x: object) -> bool:
    return not isinstance(x, float) or math.isfinite(x)


def _printed_from_literal(raw: str | None, value: float) -> PrintedNumber | None:
    """Read the printed number from the raw TOML literal if it matches ``value``."""
    if raw is None:
        return None
    if raw[:1] in "\"'":
        return None
    p = parse_printed(raw)
    if p is None:
        return None
    try:
        if float(p.value) != float(value):
            return None
    except (OverflowError, ValueError):
        return None
    return p


def _number(value: Any, what: str, path: str | None, line: int | None, fld: str | None, *,
            raw: str | None = None) -> PrintedNumber:
    """An exact printed number from a TOML int/float/string; AnswerKeyError otherwise."""
    if isinstance(value, bool):
        raise _err(f"{what} must be a number, got a boolean", path, line, fld)
    if isinstance(value, int):
        if abs(value) > _MAX_ABS:
            raise _err(f"{what} is too large ({len(str(value))} digits)", path, line, fld)
        return PrintedNumber(Fraction(value), Fraction(0), str(value))  # a whole number in full: exact
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _err(f"{what} must be finite, got {value!r}", path, line, fld)
        p = _printed_from_literal(raw, value)
        if p is not None:
            return p
        p = parse_printed(repr(value))
        if p is None:  # pragma: no cover - repr of a finite float always parses
            raise _err(f"{what}: cannot read {value!r}", path, line, fld)
        if abs(p.value) > _MAX_ABS:
            raise _err(f"{what} is too large", path, line, fld)
        return p
    if isinstance(value, str):
        p = parse_printed(value)
        if p is None:
            raise _err(f"{what} {value!r} is not a number (forms: 107.81, '1,103.61', '~870', '6.7e-02', '3/7')",
                       path, line, fld)
        if abs(p.value) > _MAX_ABS:
            raise _err(f"{what} is too large", path, line, fld)
        return p
    raise _err(f"{what} must be a number or a printed number string, got {type(value).__name__}", path, line, fld)


def _check_input_value(q: Quantity, name: str, v: Any, path: str | None, line: int | None, fl: str | None,  # noqa: C901 - one branch per input kind, each raising the error that names it
                       qmod: ModuleType) -> None:
    qi: Any = q.input(name)  # None only for a preset (kind "preset", returned below) or a layout input
    if qi is None and name != "model":  # the order of a layout quantity, or a degree it needs
        _check_layout_input(name, v, path, line, fl)
        return
    kind = qi.kind if qi is not None else "preset"
    if kind == "preset":
        if not isinstance(v, str) or v not in qmod.preset_names():
            raise _err(f"model must be one of {', '.join(qmod.preset_names())}, got {v!r}", path, line, fl)
        return
    if kind in ("vector", "matrix"):
        rows = v if isinstance(v, list) else None
        if kind == "vector":
            ok = rows is not None and 0 < len(rows) <= _MAX_ARRAY and all(_is_number(x) and _finite(x) for x in rows)
        else:
            ok = (rows is not None and 0 < len(rows) <= _MAX_ARRAY
                  and all(isinstance(r, list) and 0 < len(r) <= _MAX_ARRAY
                          and all(_is_number(x) and _finite(x) for x in r) for r in rows))
        if not ok or rows is None:
            raise _err(f"must be a {'list of numbers' if kind == 'vector' else 'list of rows of numbers'}",
                       path, line, fl)
        if kind == "matrix" and sum(len(r) for r in rows) > _MAX_ELEMENTS:
            raise _err(f"a matrix input holds at most {_MAX_ELEMENTS} numbers", path, line, fl)
        if any(abs(x) > _MAX_ABS for x in (rows if kind == "vector" else [x for r in rows for x in r])):
            raise _err("value too large", path, line, fl)
        return
    if isinstance(v, bool):
        if kind != "flag":
            raise _err(f"must be a number, got {v!r}", path, line, fl)
        return
    if _is_number(v):
        if not _finite(v):
            raise _err(f"must be finite, got {v!r}", path, line, fl)
        if abs(v) > _MAX_ABS:
            raise _err("value too large", path, line, fl)
        _domain(qi, _exact_float(v) if isinstance(v, float) else v, path, line, fl)
        return
    if isinstance(v, str):
        if v.startswith("@"):
            return  # checked once every claim id is known
        value = _parse_quantity_string(v, qi.unit, qmod)
        if value is None:
            raise _err(f"{v!r} is neither a number nor a number with a unit convertible to "
                       f"{qi.unit or 'a plain number'} (e.g. '80 GB'), nor an '@claim-id' reference", path, line, fl)
        _domain(qi, value, path, line, fl)
        return
    raise _err(f"must be a number, a string like '80 GB' or '@claim-id', got {type(v).__name__}", path, line, fl)


def _check_layout_input(name: str, v: Any, path: str | None, line: int | None, fl: str | None) -> None:
    from distcheck.audit import layout_order
    from distcheck.core.errors import ConfigError

    if name == "order":
        try:
            layout_order.parse(v)
        except ConfigError as exc:
            raise _err(str(exc), path, line, fl) from None
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _err(f"{name}={v!r} must be an integer >= 1 (a parallel degree)", path, line, fl)
    if v > _MAX_ABS:
        raise _err("value too large", path, line, fl)


def _domain(qi: QuantityInput, value: Any, path: str | None, line: int | None, fl: str | None) -> None:
    from distcheck.core.closed_form import Input
    from distcheck.core.errors import ConfigError

    try:
        Input(qi.name, qi.description, qi.unit, qi.kind, None).validate(value)
    except ConfigError as exc:
        raise _err(str(exc), path, line, fl) from None


def _parse_quantity_string(text: str, target_unit: str, qmod: ModuleType) -> Fraction | None:
    """'80 GB' -> 80e9 when target_unit is bytes; '3/7' -> 3/7. None if not convertible."""
    m = _WITH_UNIT.match(text)
    if not m:
        return None
    p = parse_printed(m["num"])
    if p is None or abs(p.value) > _MAX_ABS:
        return None
    unit = (m["unit"] or "").strip()
    if not unit:
        return p.value
    if not qmod.is_known_unit(unit) or not target_unit or not qmod.is_known_unit(target_unit):
        return None
    try:
        f = qmod.unit_factor(target_unit, unit)
    except ValueError:
        return None
    return p.value * f


def _claimed(value: Any, q: Quantity, unit: str, raw: str | None, path: str | None, line: int | None,
             fl: str | None) -> tuple[Fraction | tuple[Fraction, ...], str, Fraction]:
    """(exact claimed value, text as printed, inferred step)."""
    if q.array:
        if not isinstance(value, list) or not 0 < len(value) <= _MAX_ARRAY:
            raise _err(f"{q.name} is a vector: claimed must be a non-empty list of numbers", path, line, fl)
        items = [_number(x, "claimed element", path, line, fl) for x in value]
        return (tuple(p.value for p in items), "[" + ", ".join(p.text for p in items) + "]",
                max(p.step for p in items))
    if isinstance(value, bool):
        if q.unit != "flag":
            raise _err(f"claimed is a boolean but {q.name} is not a flag", path, line, fl)
        return Fraction(int(value)), str(value).lower(), Fraction(0)
    if isinstance(value, list):
        raise _err(f"claimed must be a single number for {q.name}", path, line, fl)
    p = _number(value, "claimed", path, line, fl, raw=raw)
    if q.unit == "flag":
        if p.value not in (0, 1):
            raise _err("a flag is claimed as true/false (or 1/0)", path, line, fl)
        return p.value, p.text, Fraction(0)
    return p.value, p.text, p.step


def parse_input_string(text: str, target_unit: str) -> Fraction | None:
    """Public wrapper: '80 GB' converted to ``target_unit`` (exact), None if not convertible.
    Raises ConfigError when ``text`` or ``target_unit`` is not a str."""
    from distcheck.audit import quantities as qmod

    check_type("text", text, str, "must be a str such as '80 GB'")
    check_type("target_unit", target_unit, str, "must be a unit name (a str)")
    return _parse_quantity_string(text, target_unit, qmod)


#: the input kinds whose printed value carries the precision of its digits: real-valued measurements
#: (a time, a memory budget). Counts, sizes in whole bytes, degrees and flags are the whole numbers the
#: source computed with, read exactly however they are written.
ROUNDED_INPUT_KINDS = ("positive", "nonnegative")


def input_step(value: object, kind: str, target_unit: str) -> Fraction:
    """The rounding step of an input as printed, in the input's unit (0: exact).

    An input of a kind in :data:`ROUNDED_INPUT_KINDS` written with a decimal point, an exponent or a
    ``~`` was rounded at its last digit, as a figure is (:mod:`distcheck.audit.numbers`): ``time_s =
    0.012346`` stands for 0.0123455 to 0.0123465, ``gpu_bytes = "80.5 GB"`` for 80.45 to 80.55 GB. A TOML
    float is read from its shortest repr, which drops trailing zeros (``1.20`` reads as ``1.2``; write
    ``"1.20"`` to keep them); a whole number written in full, a ratio (``"1/100"``), an ``"@claim"``
    reference (the source's own number) and every other kind are exact. Raises ConfigError for a
    ``kind`` or ``target_unit`` that is not a str."""
    from distcheck.audit import quantities as qmod

    check_type("kind", kind, str, "must be an input kind (a str)")
    check_type("target_unit", target_unit, str, "must be a unit name (a str)")
    if kind not in ROUNDED_INPUT_KINDS or isinstance(value, bool):
        return Fraction(0)
    if isinstance(value, float):
        p = parse_printed(repr(value)) if math.isfinite(value) else None
        return Fraction(0) if p is None else p.step
    if isinstance(value, str) and not value.startswith("@"):
        m = _WITH_UNIT.match(value)
        p = parse_printed(m["num"]) if m else None
        if m is None or p is None:
            return Fraction(0)
        unit = (m["unit"] or "").strip()
        if not unit:
            return p.step
        try:
            return p.step * qmod.unit_factor(target_unit, unit)
        except ValueError:
            return Fraction(0)
    return Fraction(0)
