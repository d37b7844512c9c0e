"""Verdicts: recompute each claim exactly, compare it with the printed figure, search conventions,
and check the claims of one key against each other.

A claim gets one of

* ``holds``: the value recomputed under the default convention (the quantity it
  names, the inputs it gives, its unit) lies within half a rounding step of the
  printed figure;
* ``holds-through-input-rounding``: it does not at the printed inputs, but does at
  values that the rounding of inputs printed with precision allows
  (:mod:`distcheck.audit.rounded_inputs`); the verdict names each such input, the
  values of it that make the figure hold and how far they are from the printed one;
* ``holds-under-another-convention``: it does not, but exactly one minimal set
  of documented alternatives (:mod:`distcheck.audit.conventions`) reproduces it;
* ``ambiguous``: several minimal sets reproduce it and the default does not; or it
  holds, but contradicts another claim that holds on the same inputs (a consistency
  check finds the two figures cannot both be right): the rounding of an input decides
  which, and the verdict names that input's values for each claim;
* ``wrong``: no documented convention (up to ``MAX_CHANGES`` at once) reproduces it;
* ``not-checkable``: the quantity has no closed form (a measurement on an
  unpublished random draw, a reported fact), or a required input is missing.

What a printed figure stands for (its rounding step, whole counts, tie rules) is
stated in :mod:`distcheck.audit.figures`. Consistency between claims (``[[check]]``
tables and the automatic same-quantity check) is in :mod:`distcheck.audit.consistency`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, TypedDict

from distcheck.audit import conventions as conv
from distcheck.audit import layout_order
from distcheck.audit import quantities as qmod
from distcheck.audit.claim_units import factor_across
from distcheck.audit.consistency import CheckVerdict, check_key
from distcheck.audit.constraints import broken
from distcheck.audit.contradictions import settle
from distcheck.audit.counts import uneven_split
from distcheck.audit.exact_values import Exact, _compute, _distance, _fmt, _in_unit, _matches, _not_whole, _value_in
from distcheck.audit.explain import COMPONENT_FLAGS, one_component
from distcheck.audit.key_values import _domain, _exact_float, parse_input_string
from distcheck.audit.keys import (
    AMBIGUOUS,
    HOLDS,
    HOLDS_ROUNDED,
    NOT_CHECKABLE,
    OTHER,
    UNDECIDED,
    WRONG,
    AnswerKey,
    Claim,
    load_key,
)
from distcheck.audit.numbers import format_exact
from distcheck.audit.quantity import InputValues
from distcheck.audit.rounded_inputs import RoundingReading, describe, input_steps, meets, read_rounding, span_of_inputs
from distcheck.core.errors import AnswerKeyError, ConfigError
from distcheck.core.validate import check_type
from distcheck.core.vocab import Axis

__all__ = ["ClaimVerdict", "AuditResult", "audit_key", "audit_file", "audit_exit_code"]

@dataclass
class ClaimVerdict:
    """The verdict on one claim.

    ``computed`` is the exact value under the default convention in the quantity's
    unit (None when not checkable); ``computed_in_unit`` the same in the claim's
    unit. ``convention`` names the variants that reproduce the figure
    (holds-under-another-convention); ``alternatives`` lists every reproducing set
    (ambiguous) or the closest one tried (wrong), each ``{"convention", "value", "unit"}``:
    the value in ``unit``, which is the claim's unit except when the variant reads the
    figure in another unit ("GB read as GiB": the value is then in GiB), and ``"rounding"``
    (a RoundingReading) when the variant reproduces it only through the rounding of its inputs.
    ``rounding`` says how the verdict depends on the inputs printed with precision (None when
    the claim has none, or is judged at the printed values); ``contradicts`` lists the
    contradicting consistency checks that made a claim that held ``ambiguous``, each
    ``{"check": id, "claims": (the other claims that held), "was": the verdict it had}``.
    """

    claim: Claim
    verdict: str
    explanation: str
    quantity_unit: str = ""
    computed: Exact | None = None
    computed_in_unit: Exact | None = None
    convention: str | None = None
    alternatives: list = field(default_factory=list)
    inputs: dict = field(default_factory=dict)
    rounding: RoundingReading | None = None
    contradicts: list = field(default_factory=list)

    @property
    def error(self) -> float | None:
        """|recomputed - printed| in the claim's unit (largest element for vectors); None if not computed."""
        if self.computed_in_unit is None:
            return None
        if isinstance(self.computed_in_unit, tuple):
            if not isinstance(self.claim.claimed, tuple) or len(self.claim.claimed) != len(self.computed_in_unit):
                return None
            return float(max(abs(a - b) for a, b in zip(self.computed_in_unit, self.claim.claimed, strict=True)))
        return float(abs(Fraction(self.computed_in_unit) - self.claim.claimed))


@dataclass
class AuditResult:
    """Everything the audit of one key found."""

    path: str
    title: str
    source: str
    claims: list[ClaimVerdict]
    checks: list[CheckVerdict]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.claims:
            out[v.verdict] = out.get(v.verdict, 0) + 1
        n = sum(c.verdict == "contradiction" for c in self.checks)
        if n:
            out["contradiction"] = n
        return out

    @property
    def contradictions(self) -> list[CheckVerdict]:
        return [c for c in self.checks if c.verdict == "contradiction"]


# ----------------------------------------------------------------------------- helpers


def _input_line(c: Claim, name: str | None) -> int | None:
    if name is None:
        return c.lines.get("inputs", c.line)
    return c.lines.get(f"inputs.{name}", c.lines.get("inputs", c.line))


class _Missing(Exception):
    def __init__(self, names: list[str]) -> None:
        self.names = names


def _resolve(c: Claim, q: qmod.Quantity, key: AnswerKey) -> tuple[dict, str | None]:  # noqa: C901 - one case per kind of input value (preset, string, reference)
    """Exact input values (presets filled, strings converted, references followed).
    Raises AnswerKeyError for a bad value and _Missing for required inputs not given."""
    values: dict = {}
    model = c.inputs.get("model")
    fld = f"claim[{c.index}] ({c.id}).inputs"
    if isinstance(model, str):
        try:
            values.update(qmod.preset_inputs(model, q))
        except ConfigError as exc:
            raise AnswerKeyError(str(exc), path=key.path, line=_input_line(c, "model"), field=f"{fld}.model") from None
    for name, v in c.inputs.items():
        if name in ("model", "order"):
            continue
        qi = q.input(name)
        if isinstance(v, bool):
            values[name] = Fraction(int(v))
        elif isinstance(v, int):
            values[name] = Fraction(v)
        elif isinstance(v, float):
            values[name] = _exact_float(v)
        elif qi is None:  # pragma: no cover - keys.validate_data allows only integer degrees beyond the inputs
            raise AnswerKeyError(f"{name!r} is not an input of {q.name}", path=key.path, line=_input_line(c, name),
                                 field=f"{fld}.{name}")
        elif isinstance(v, str) and v.startswith("@"):
            ref = key.claim(v[1:])
            if isinstance(ref.claimed, tuple):
                raise AnswerKeyError(f"{v!r} references a vector claim", path=key.path, line=_input_line(c, name),
                                     field=f"{fld}.{name}")
            try:
                f = qmod.unit_factor(qi.unit, ref.unit) if qi.unit and qmod.is_known_unit(qi.unit) else None
            except ValueError:
                f = None
            if f is None:
                if qi.unit and qmod.unit_family(qi.unit) != qmod.unit_family(ref.unit):
                    raise AnswerKeyError(
                        f"{v!r} is in {ref.unit} but input {name} is in {qi.unit or 'plain numbers'}",
                        path=key.path, line=_input_line(c, name), field=f"{fld}.{name}")
                f = Fraction(1)
            # the referenced figure meets the input's domain like a literal would (no negative sizes)
            _domain(qi, ref.claimed * f, key.path, _input_line(c, name), f"{fld}.{name} ({v})")
            values[name] = ref.claimed * f
        elif isinstance(v, str):
            values[name] = parse_input_string(v, qi.unit)
        elif isinstance(v, list):
            if qi.kind == "vector":
                values[name] = tuple(_num(x) for x in v)
            else:
                values[name] = tuple(tuple(_num(x) for x in row) for row in v)
        else:  # pragma: no cover - keys.validate_data rejects other types
            raise AnswerKeyError(f"unsupported input value {v!r}", path=key.path, line=_input_line(c, name),
                                 field=f"{fld}.{name}")
    missing = [n for n in q.required if n not in values]
    if missing:
        raise _Missing(missing)
    return values, model if isinstance(model, str) else None


def _num(x: Any) -> Fraction:
    return _exact_float(x) if isinstance(x, float) else Fraction(x)


def _input_names(name: str) -> dict | None:
    try:
        q = qmod.get_quantity(name)
    except KeyError:
        return None
    if q.compute is None:
        return None
    return {i.name: (None if i.default is None else Fraction(i.default)) for i in q.inputs}


def _form_value(name: str) -> Fraction:
    value = _compute(qmod.get_quantity(name), {})
    if isinstance(value, tuple):
        raise ConfigError(name, "a vector", "must be a number to set an input to")
    return value


# ----------------------------------------------------------------------------- one claim


class _Recomputed(TypedDict):
    """The fields of a ClaimVerdict every recomputed claim shares."""

    claim: Claim
    quantity_unit: str
    computed: Exact
    computed_in_unit: Exact
    inputs: dict[str, str]


def audit_claim(c: Claim, key: AnswerKey) -> ClaimVerdict:  # noqa: C901 - the verdict ladder: each case a verdict of its own
    """The verdict on claim ``c`` of ``key`` (see the module docstring)."""
    q = qmod.get_quantity(c.quantity)
    if q.compute is None:
        why = q.reason or "no closed form"
        return ClaimVerdict(c, NOT_CHECKABLE, f"{why}" + (f"; {c.note}" if c.note else ""), q.unit)
    try:
        values, model = _resolve(c, q, key)
    except _Missing as m:
        return ClaimVerdict(c, NOT_CHECKABLE,
                            f"{c.quantity} needs {', '.join(m.names)}, which the claim does not give", q.unit)
    # inputs only the conventions and unit bridges read (Quantity.convention_inputs), apart from the formula's
    extra = {k: values.pop(k) for k in q.convention_input_names if k in values}
    around = {i.name: Fraction(i.default) for i in q.convention_inputs if i.default is not None} | extra
    # a quantity's own constraints (distcheck.audit.constraints): outside them its formula does not apply
    full_values = {i.name: Fraction(i.default) for i in q.inputs if i.default is not None} | values
    bad = broken(q.requires, full_values)
    if bad:
        read = dict.fromkeys(x for b in bad for x in b.inputs)
        given = ", ".join(f"{n}={format_exact(full_values[n])}" for n in read)
        named = "; ".join(f"{b.text} ({b.source})" for b in bad)
        return ClaimVerdict(c, NOT_CHECKABLE, f"the inputs ({given}) break a constraint of {q.name}: {named}", q.unit,
                            inputs={k: str(v) for k, v in values.items() if not isinstance(v, tuple)})
    order = c.inputs.get("order")
    value: Exact
    try:
        if set(values) - set(q.input_names) or (order is not None and q.name in layout_order.ORDERED):
            # a layout figure under a stated order, or with the degrees one needs (distcheck.audit.layout_order)
            full = {i.name: Fraction(i.default) for i in q.inputs if i.default is not None} | values
            value = layout_order.compute(q.name, full, order or layout_order.DEFAULT)
        else:
            value = _compute(q, values)
    except ConfigError as exc:
        raise AnswerKeyError(f"claim {c.id!r}: {exc}", path=key.path, line=_input_line(c, None),
                             field=f"claim[{c.index}] ({c.id}).inputs") from None
    in_unit = _in_unit(value, q.unit, c.unit, around)
    shown = {k: (str(v) if not isinstance(v, tuple) else "vector") for k, v in (values | extra).items()}
    if order is not None:
        shown["order"] = "-".join(a for a in layout_order.parse(order) if a != Axis.EP)
    base: _Recomputed = {"claim": c, "quantity_unit": q.unit, "computed": value, "computed_in_unit": in_unit,
                         "inputs": shown}
    printed = f"printed {c.claimed_text}" + ("" if c.unit == "flag" else f" {c.unit}") + (
        " (exact)" if c.step == 0 else f" (+-{float(c.step / 2):g})")
    # a count computed as a fraction counts nothing: the inputs do not divide evenly, and no figure holds
    # the printed precision of the formula's own inputs (a bridged figure is judged at the printed inputs)
    steps = {} if set(values) - set(q.input_names) or qmod.bridge_between(q.unit, c.unit) else {
        n: st for n, st in input_steps(c, q).items() if n in q.input_names}
    uneven = None
    if _not_whole(value, q.unit):
        full = {i.name: Fraction(str(i.default)) for i in q.inputs if i.default is not None} | values
        noun = (qmod.unit_family(c.unit) or ":").split(":", 1)[1] or q.unit
        uneven = f"{q.name} counts whole {noun}: {uneven_split(q.name, full, Fraction(value))}"
    elif _matches(in_unit, c.claimed, c.step):
        # the values of its rounded inputs at which it holds, should another claim on them contradict it
        at = read_rounding(q, values, steps, c.unit, c.claimed, c.step, _value_in) if steps else None
        return ClaimVerdict(verdict=HOLDS, explanation=f"recomputed {_fmt(in_unit, c.unit)}; {printed}",
                            rounding=at, **base)
    span = span_of_inputs(q, values, steps, c.unit, _value_in) if uneven is None else None
    rounded = ", ".join(f"{n} = {format_exact(values[n], 9)} +-{format_exact(steps[n] / 2, 3)}" for n in steps)
    if meets(span, c.claimed, c.step):
        assert span is not None  # meets is False without a span
        reading = read_rounding(q, values, steps, c.unit, c.claimed, c.step, _value_in)
        needs = f": it holds with {describe(reading, _fmt)}" if reading is not None else ""
        return ClaimVerdict(verdict=HOLDS_ROUNDED, rounding=reading, explanation=(
            f"recomputed {_fmt(in_unit, c.unit)} at the printed inputs, outside {printed}; it holds only through "
            f"the rounding of its inputs ({rounded}), over which the value lies in [{_fmt(span[0])}, "
            f"{_fmt(span[1])}] {c.unit}{needs}"), **base)
    default = f"default gives {_fmt(in_unit, c.unit)}" + (f" ({uneven})" if uneven else "") + (
        f" (in [{_fmt(span[0])}, {_fmt(span[1])}] within the printed precision of {rounded})" if span else "")

    matches, closest = _search(c, q, values, model, steps, extra)
    if not matches and order is None:  # a layout figure printed under another framework's order
        full = {i.name: Fraction(i.default) for i in q.inputs if i.default is not None} | values
        for name, alt in layout_order.alternatives(q.name, full):
            alt_in = _in_unit(alt, q.unit, c.unit, around)
            if _matches(alt_in, c.claimed, c.step):
                matches.append((name, alt_in, c.unit, None))
    if len(matches) == 1:
        name, v, u, r = matches[0]
        return ClaimVerdict(
            verdict=OTHER, convention=name, alternatives=[_alternative(name, v, u, r)], rounding=r,
            explanation=f"{default}; {printed} is reproduced with {name}: {_fmt(v, u)}{_through(r)}", **base)
    if len(matches) > 1:
        listed = "; ".join(f"{n} -> {_fmt(v, u)}{_through(r)}" for n, v, u, r in matches)
        return ClaimVerdict(
            verdict=AMBIGUOUS, alternatives=[_alternative(n, v, u, r) for n, v, u, r in matches],
            explanation=f"{default}; {printed} is reproduced by several conventions: {listed}", **base)
    near = "; no documented convention reproduces it"
    alts = []
    if closest is not None:
        near += f" (closest: {closest[0]} -> {_fmt(closest[1], closest[2])})"
        alts = [{"convention": closest[0], "value": closest[1], "unit": closest[2]}]
    if uneven:
        return ClaimVerdict(
            verdict=WRONG, alternatives=alts,
            explanation=f"recomputed {_fmt(in_unit, c.unit)}, but {uneven}; {printed} cannot count it{near}", **base)
    diff = _distance(in_unit, c.claimed)
    rel = ""
    if not isinstance(in_unit, tuple) and in_unit != 0:
        rel = f" ({float(diff / abs(in_unit)):.2%} of the recomputed value)"
    which = _one_component(q, values, value, c, around)
    if span is not None:
        which += (f"; within the printed precision of its inputs ({rounded}) it lies in "
                  f"[{_fmt(span[0])}, {_fmt(span[1])}]")
    return ClaimVerdict(
        verdict=WRONG, alternatives=alts,
        explanation=f"recomputed {_fmt(in_unit, c.unit)}; {printed}; off by {_fmt(diff, c.unit)}{rel}{which}{near}",
        **base)


def _alternative(name: str, value: Exact, unit: str, reading: RoundingReading | None) -> dict:
    out: dict[str, object] = {"convention": name, "value": value, "unit": unit}
    if reading is not None:
        out["rounding"] = reading
    return out


def _through(reading: RoundingReading | None) -> str:
    """How a convention's value reproduces the figure only through the rounding of the inputs ("" at the printed)."""
    if reading is None:
        return ""
    return f" (at the printed inputs it does not: only through their rounding, with {describe(reading, _fmt)})"


def _one_component(q: qmod.Quantity, values: dict, value: Exact, c: Claim, around: InputValues) -> str:
    """Which single component (a flag of the quantity) the difference is, if exactly one (distcheck.audit.explain)."""
    flags = tuple(n for n in q.input_names if n in COMPONENT_FLAGS)
    if not flags or isinstance(value, tuple) or isinstance(c.claimed, tuple):
        return ""
    full = {i.name: Fraction(i.default) for i in q.inputs if i.default is not None} | values

    def recompute(v: dict) -> Fraction:
        out = _compute(q, v)
        if isinstance(out, tuple):
            raise ConfigError(q.name, "a vector", "must be a number to compare with one component")
        return out

    return one_component(flags, full, Fraction(value), c.claimed, c.step, factor_across(q.unit, c.unit, around),
                         recompute) or ""


def _search(c: Claim, q: qmod.Quantity, values: dict, model: str | None, steps: dict[str, Fraction] | None = None,  # noqa: C901 - the search's cases: reproducing, rounding, closest single change
            extra: dict | None = None) -> tuple[list[tuple[str, Exact, str, RoundingReading | None]],
                                                tuple[str, Exact, str] | None]:
    """(reproducing [(names, value, unit, rounding)] at the fewest changes, closest single change or None).

    ``value`` is in ``unit``: the claim's unit, or the unit a "GB read as GiB" variant reads it in; ``rounding`` is
    None when the value at the printed inputs reproduces the figure, else how the rounding of the inputs printed
    with precision does (:func:`distcheck.audit.rounded_inputs.read_rounding`). ``extra``: the claim's convention
    inputs (a variant's quantity takes those it has; all make variants that need them apply)."""
    extra = extra or {}
    around = {i.name: Fraction(i.default) for i in q.convention_inputs if i.default is not None} | extra
    given = dict(values) | extra
    if model is not None:
        given["model"] = model
    axes = conv.axes_for(q.name, c.unit, given)
    matches: list[tuple[str, Exact, str, RoundingReading | None]] = []
    closest = None
    best = None
    for k in range(1, min(conv.MAX_CHANGES, len(axes)) + 1):
        for chosen in itertools.combinations(axes, k):
            for variants in itertools.product(*(a.variants for a in chosen)):
                ordered = sorted(variants, key=lambda v: v.quantity is None)
                state: tuple[str, dict, str] | None = (q.name, {n: v for n, v in values.items()} | extra, c.unit)
                for v in ordered:
                    assert state is not None  # the loop breaks on None
                    state = conv.apply_variant(v, *state, model=model, form_value=_form_value,
                                               nominal=qmod.nominal_params, input_names=_input_names,
                                               optional=frozenset(extra))
                    if state is None:
                        break
                if state is None:
                    continue
                qname, vals, unit = state
                try:
                    alt_q = qmod.get_quantity(qname)
                    alt_full = {i.name: Fraction(i.default) for i in alt_q.inputs if i.default is not None} | vals
                    if broken(alt_q.requires, alt_full):
                        continue  # a reading outside its quantity's constraints reproduces nothing
                    value = _compute(alt_q, vals)
                    value_in = _in_unit(value, alt_q.unit, unit, around | alt_full)
                except (ConfigError, ValueError, KeyError):
                    continue
                if _not_whole(value, alt_q.unit):  # an uneven count reproduces no figure
                    continue
                # the figure read in `unit` is claimed (in that unit); compare there, report in the claim's unit
                name = " + ".join(v.name for v in variants)
                d = _distance(value_in, c.claimed)
                if k == 1 and (best is None or d < best):  # a combination is offered only when it reproduces
                    best, closest = d, (name, value_in, unit)
                if _matches(value_in, c.claimed, c.step):
                    matches.append((name, value_in, unit, None))
                elif steps and qmod.bridge_between(alt_q.unit, unit) is None:  # printed precision (not bridged)
                    kept = {n: st for n, st in steps.items() if n in vals and vals[n] == values.get(n)}
                    if meets(span_of_inputs(alt_q, vals, kept, unit, _value_in), c.claimed, c.step):
                        matches.append((name, value_in, unit, read_rounding(
                            alt_q, vals, kept, unit, c.claimed, c.step, _value_in) or RoundingReading(False, ())))
        if matches:
            break
    return matches, closest


# ----------------------------------------------------------------------------- entry points


def audit_key(key: AnswerKey) -> AuditResult:
    """Audit a parsed key: one ClaimVerdict per claim, one CheckVerdict per check (explicit,
    then automatic). Raises AnswerKeyError for inputs a closed form rejects, ConfigError when
    ``key`` is not an AnswerKey."""
    check_type("key", key, AnswerKey, "must be an AnswerKey (see load_key, parse_key)")
    verdicts = [audit_claim(c, key) for c in key.claims]
    recomputed = [(v.claim, v.inputs) for v in verdicts if v.computed is not None]
    checks = check_key(key, recomputed)
    settle(verdicts, checks)
    return AuditResult(key.path, key.title, key.source, verdicts, checks)


def audit_file(path: str | Path) -> AuditResult:
    """Load, validate and audit the answer key at ``path`` (AnswerKeyError on a malformed key)."""
    return audit_key(load_key(path))


def audit_exit_code(result: AuditResult | list[AuditResult], *, strict: bool = False) -> int:
    """1 when any claim is wrong or any consistency check finds a contradiction, else 0.

    With ``strict``, also 1 when any claim is undecided (``ambiguous`` or ``not-checkable``,
    :data:`~distcheck.audit.keys.UNDECIDED`): the exit status then says every figure was decided.
    Raises ConfigError when ``result`` is not an AuditResult or a list of them, or ``strict`` not a bool."""
    results = result if isinstance(result, list) else [result]
    for i, r in enumerate(results):
        check_type(f"result[{i}]" if isinstance(result, list) else "result", r, AuditResult,
                   "must be an AuditResult (see audit_file)")
    check_type("strict", strict, bool, "must be True or False")
    for r in results:
        if any(v.verdict == WRONG for v in r.claims) or r.contradictions:
            return 1
        if strict and any(v.verdict in UNDECIDED for v in r.claims):
            return 1
    return 0
