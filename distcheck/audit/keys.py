"""Answer keys: parse a TOML file (``tomllib`` only, nothing is evaluated) and validate it.

An answer key (and a golden key: the same format) is::

    [meta]
    title = "..."                # required
    source = "..."               # required: document, URL or citation

    [[claim]]
    id = "lesson.7b.state"       # unique in the key: letters, digits, . _ - :
    quantity = "memory.train_state_bytes"   # a name of distcheck.audit.list_quantities()
    inputs = { params = 6738149376, bytes_per_param = 16 }
    claimed = 107.81             # number, printed string ("~109", "1,103.61", "3/7"), bool or list
    unit = "GB"
    rounding = 0.01              # optional: the step of the printed figure
    note = "..."                 # optional
    section = "§3 The math"      # optional in answer keys, required in goldens
    expect = "holds"             # optional in answer keys, required in goldens

    [[check]]                    # optional cross-claim consistency checks
    id = "lesson.7b.total"
    kind = "sum"                 # sum | product | equal
    total = "lesson.7b.with_activations"
    parts = ["lesson.7b.state", "lesson.7b.activations"]   # claim ids or literal numbers
    expect = "consistent"        # consistent | contradiction

Rounding. Without ``rounding`` the step is read from the digits as printed in
the file (the raw TOML literal, so ``108.60`` keeps its trailing zero; see
:mod:`distcheck.audit.numbers`): a decimal point, an exponent or a ``~`` make
the last digit a rounded one, while a whole number written in full (``5``,
``"1,024"``) and a ratio string (``"3/7"``) are exact. A stated ``rounding``
must divide the figure (``~870`` with ``rounding = 10``). The claim holds when
the recomputed value lies within half a step (:mod:`distcheck.audit.figures`).

Every problem raises :class:`distcheck.core.errors.AnswerKeyError` naming the file,
the line of the claim or field (found by scanning the text) and the field.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from types import ModuleType
from typing import Any

from distcheck.audit.files import MAX_KEY_BYTES, as_path, path_text, read_key_bytes
from distcheck.audit.key_lines import _Lines, _scan
from distcheck.audit.key_values import _MAX_ARRAY, _check_input_value, _claimed, _err, _number
from distcheck.audit.key_values import parse_input_string as parse_input_string  # read as keys.parse_input_string
from distcheck.audit.numbers import parse_printed
from distcheck.core.errors import AnswerKeyError, UnknownQuantityError
from distcheck.core.validate import check_type

__all__ = [
    "VERDICTS",
    "UNDECIDED",
    "CHECK_VERDICTS",
    "CHECK_KINDS",
    "MAX_CLAIMS",
    "MAX_CHECKS",
    "Claim",
    "Check",
    "AnswerKey",
    "parse_key",
    "load_key",
    "validate_data",
]

HOLDS, WRONG, OTHER, AMBIGUOUS, NOT_CHECKABLE = (
    "holds", "wrong", "holds-under-another-convention", "ambiguous", "not-checkable")
#: holds, but not at the printed inputs: only at values the rounding of an input printed with precision allows
HOLDS_ROUNDED = "holds-through-input-rounding"
#: the verdicts a claim can get (and a golden claim's ``expect`` may name)
VERDICTS = (HOLDS, HOLDS_ROUNDED, WRONG, OTHER, AMBIGUOUS, NOT_CHECKABLE)
#: the verdicts that leave a claim undecided: nothing here says whether its figure is right
UNDECIDED = (AMBIGUOUS, NOT_CHECKABLE)
#: the verdicts a [[check]] can get
CHECK_VERDICTS = ("consistent", "contradiction")
CHECK_KINDS = ("sum", "product", "equal")

_TOP = ("meta", "claim", "check")
_META_REQUIRED = ("title", "source")
_META_OPTIONAL = ("note", "url", "date", "version", "author", "license")
_CLAIM_FIELDS = ("id", "quantity", "inputs", "claimed", "unit", "rounding", "note", "section", "expect")
_CHECK_FIELDS = ("id", "kind", "total", "parts", "note", "section", "expect")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")
#: the most [[claim]] tables in one key (the largest shipped golden key has under 100)
MAX_CLAIMS = 10_000
#: the most [[check]] tables in one key
MAX_CHECKS = 10_000


@dataclass(frozen=True)
class Claim:
    """One validated claim.

    ``claimed`` is exact (a Fraction, or a tuple of Fractions for array quantities);
    ``step`` is the rounding step (0 = exact), ``step_inferred`` says whether it was
    read from the printed digits; ``inputs`` holds the raw TOML values (resolved at
    audit time: presets, "80 GB" strings, "@claim" references); ``line`` is the line
    of the claim's ``[[claim]]`` header (None if unknown); ``lines`` maps fields to lines.
    """

    id: str
    quantity: str
    inputs: dict
    claimed: Any
    claimed_text: str
    unit: str
    step: Fraction
    step_inferred: bool
    note: str = ""
    section: str = ""
    expect: str | None = None
    index: int = 0
    line: int | None = None
    lines: dict = field(default_factory=dict, compare=False, repr=False)
    #: the old name the key wrote for ``quantity`` (``pipeline.bubble_fraction.gpipe`` for ``pp.bubble_fraction.gpipe``;
    #: :data:`distcheck.audit.quantities.RENAMED_PREFIXES`), "" when it wrote the current name
    alias: str = ""

    @property
    def alias_note(self) -> str:
        """The report's note on an old quantity name ("" when the key wrote the current one)."""
        if not self.alias:
            return ""
        return f"the key names {self.alias}, the old name of {self.quantity} (read as an alias; rename it)"


@dataclass(frozen=True)
class Check:
    """A cross-claim consistency check: ``total`` (claim id) = sum/product of ``parts``
    (claim ids or exact numbers), or all of ``parts`` equal (``kind = "equal"``)."""

    id: str
    kind: str
    total: str | None
    parts: tuple
    note: str = ""
    section: str = ""
    expect: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class AnswerKey:
    """A parsed, validated answer key."""

    path: str
    title: str
    source: str
    meta: dict
    claims: tuple[Claim, ...]
    checks: tuple[Check, ...]

    def claim(self, claim_id: str) -> Claim:
        for c in self.claims:
            if c.id == claim_id:
                return c
        raise KeyError(claim_id)


# ----------------------------------------------------------------------------- parsing


def load_key(path: str | os.PathLike[str]) -> AnswerKey:
    """Read and validate the answer key at ``path``.

    Only a regular file of at most :data:`MAX_KEY_BYTES` (4 MiB) is read, with at most
    :data:`MAX_CLAIMS` claims and :data:`MAX_CHECKS` checks; a named pipe, a device or a
    folder is refused without reading (no hang). Raises AnswerKeyError (file, line,
    field) for an unreadable, oversized or non-regular file, bad TOML, or any field
    that breaks the format; ConfigError when ``path`` is not a path. Never evaluates
    anything.
    """
    p = as_path("path", path)
    raw = read_key_bytes(p)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AnswerKeyError(f"not UTF-8 text (byte {exc.start})", path=str(p)) from None
    return parse_key(text, str(p))


_TOML_POS = re.compile(r"\(at line (\d+), column \d+\)")


def parse_key(text: str, path: str = "<string>") -> AnswerKey:
    """Parse and validate answer-key TOML ``text``; ``path`` names it in errors."""
    path = path_text(path)
    if not isinstance(text, str):
        raise AnswerKeyError("answer key text must be a str", path=path)
    if len(text) > MAX_KEY_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise AnswerKeyError(f"holds more than the answer-key limit of {MAX_KEY_BYTES:,} bytes (4 MiB)", path=path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _TOML_POS.search(msg)
        raise AnswerKeyError(f"not valid TOML: {msg}", path=path, line=int(m[1]) if m else None) from None
    except (RecursionError, ValueError, TypeError) as exc:  # pathological nesting or text
        raise AnswerKeyError(f"not valid TOML: {type(exc).__name__}", path=path) from None
    return validate_data(data, path=path, text=text)


def _check_str(d: dict, key: str, path: str | None, line: int | None, fld: str | None, *, required: bool) -> str:
    if key not in d:
        if required:
            raise _err(f"missing required field {key!r}", path, line, fld)
        return ""
    v = d[key]
    if not isinstance(v, str):
        raise _err(f"must be a string, got {type(v).__name__}", path, line, fld)
    if required and not v.strip():
        raise _err("must not be empty", path, line, fld)
    return v


def validate_data(data: object, *, path: str = "<data>", text: str | None = None) -> AnswerKey:  # noqa: C901 - one branch per field of a key, each raising the AnswerKeyError that names it
    """Validate already-parsed TOML ``data`` (a dict); ``text`` (optional) gives lines.

    Checks the structure, the quantity names, the input names and value types, the
    units and their compatibility with each quantity, ids (unique) and references.
    """
    from distcheck.audit import quantities as qmod

    path = path_text(path)
    if text is not None:
        check_type("text", text, str, "must be the key's TOML text (a str) or None")
    lines = _scan(text) if text is not None else _Lines()
    if not isinstance(data, dict):
        raise _err("an answer key must be a TOML table", path, None, None)
    for k in data:
        if k not in _TOP:
            raise _err(f"unknown top-level key {k!r} (allowed: meta, claim, check)", path, None, k)

    # --- meta
    meta = data.get("meta")
    mline = lines.meta.get("__header__")
    if not isinstance(meta, dict):
        raise _err("missing [meta] table with title and source", path, mline, "meta")
    for k in meta:
        if k not in _META_REQUIRED + _META_OPTIONAL:
            raise _err(f"unknown field {k!r} (allowed: {', '.join(_META_REQUIRED + _META_OPTIONAL)})",
                       path, lines.meta.get(k, mline), f"meta.{k}")
    title = _check_str(meta, "title", path, lines.meta.get("title", mline), "meta.title", required=True)
    source = _check_str(meta, "source", path, lines.meta.get("source", mline), "meta.source", required=True)
    for k in _META_OPTIONAL:
        if k in meta and not isinstance(meta[k], str):
            raise _err("must be a string", path, lines.meta.get(k, mline), f"meta.{k}")

    # --- claims
    raw_claims = data.get("claim", [])
    if not isinstance(raw_claims, list):
        raise _err("'claim' must be an array of tables ([[claim]])", path, None, "claim")
    if len(raw_claims) > MAX_CLAIMS:
        raise _err(f"holds {len(raw_claims):,} claims, over the limit of {MAX_CLAIMS:,} per answer key", path, None,
                   "claim")
    claims: list[Claim] = []
    ids: dict[str, int | None] = {}
    for i, rc in enumerate(raw_claims):
        cl = lines.claims[i] if i < len(lines.claims) else {}
        claims.append(_claim(rc, i, cl, lines, path, ids, qmod))

    # --- checks
    raw_checks = data.get("check", [])
    if not isinstance(raw_checks, list):
        raise _err("'check' must be an array of tables ([[check]])", path, None, "check")
    if len(raw_checks) > MAX_CHECKS:
        raise _err(f"holds {len(raw_checks):,} checks, over the limit of {MAX_CHECKS:,} per answer key", path, None,
                   "check")
    checks: list[Check] = []
    claim_ids = {c.id for c in claims}
    for i, rk in enumerate(raw_checks):
        kl = lines.checks[i] if i < len(lines.checks) else {}
        checks.append(_check(rk, i, kl, path, ids, claim_ids))
    if not claims and not checks:
        raise _err("the key has no [[claim]]", path, None, "claim")

    # --- "@id" input references must name claims of this key (no self-reference)
    for c in claims:
        for name, v in c.inputs.items():
            if isinstance(v, str) and v.startswith("@"):
                ref = v[1:]
                if ref not in claim_ids or ref == c.id:
                    raise _err(f"claim {c.id!r}: input {name} = {v!r} must reference another claim of this key",
                               path, c.lines.get(f"inputs.{name}", c.lines.get("inputs", c.line)),
                               f"claim[{c.index}].inputs.{name}")
    return AnswerKey(path=path, title=title, source=source, meta=dict(meta), claims=tuple(claims), checks=tuple(checks))


def _table_head(raw: Any, kind: str, i: int, lines: dict, fields: tuple, path: str,
                ids: dict[str, int | None]) -> tuple[str, str, Callable[[str], int | None]]:
    """The checks every [[claim]] and [[check]] starts with: a table, known fields, a valid unique id.
    Returns (id, field prefix for errors, line of a field)."""
    header = lines.get("__header__")
    base = f"{kind}[{i}]"
    if not isinstance(raw, dict):
        raise _err(f"each {kind} must be a table", path, header, base)

    def ln(key: str) -> int | None:
        return lines.get(key, header)

    for k in raw:
        if k not in fields:
            raise _err(f"unknown field {k!r} (allowed: {', '.join(fields)})", path, ln(k), f"{base}.{k}")
    cid = _check_str(raw, "id", path, ln("id"), f"{base}.id", required=True)
    if not _ID.match(cid) or len(cid) > 200:
        raise _err(f"id {cid!r} must be letters, digits and . _ - : (starting with a letter or digit)",
                   path, ln("id"), f"{base}.id")
    if cid in ids:
        raise _err(f"duplicate id {cid!r} (first at line {ids[cid]})", path, ln("id"), f"{base}.id")
    ids[cid] = ln("id")
    return cid, f"{kind}[{i}] ({cid})", ln


def _claim(rc: Any, i: int, cl: dict, lines: _Lines, path: str, ids: dict[str, int | None], qmod: ModuleType) -> Claim:  # noqa: C901 - one branch per field of a claim, each raising the AnswerKeyError that names it
    header = cl.get("__header__")
    cid, base, ln = _table_head(rc, "claim", i, cl, _CLAIM_FIELDS, path, ids)

    qname = _check_str(rc, "quantity", path, ln("quantity"), f"{base}.quantity", required=True)
    alias, qname = (qname, qmod.renamed(qname)) if qmod.renamed(qname) else ("", qname)  # an old name, read as its new
    try:
        q = qmod.get_quantity(qname)
    except UnknownQuantityError as exc:
        raise _err(f"{exc} (see `distcheck audit --list`)", path, ln("quantity"), f"{base}.quantity") from None

    # inputs
    inputs = rc.get("inputs", {})
    if not isinstance(inputs, dict):
        raise _err("inputs must be a table, e.g. inputs = { params = 7e9 }", path, ln("inputs"), f"{base}.inputs")
    from distcheck.audit import layout_order

    allowed = set(q.input_names) | set(q.convention_input_names) | ({"model"} if q.accepts_model else set())
    if layout_order.accepts_order(qname):  # the mesh order, and the degrees it may need (distcheck.audit.layout_order)
        allowed |= {"order", *layout_order.extra_inputs(qname, q.input_names)}
    for name, v in inputs.items():
        fl = f"{base}.inputs.{name}"
        line = cl.get(f"inputs.{name}", ln("inputs"))
        if name not in allowed:
            hint = ", ".join(sorted(allowed)) or "none"
            raise _err(f"{name!r} is not an input of {qname} (inputs: {hint})", path, line, fl)
        _check_input_value(q, name, v, path, line, fl, qmod)

    # unit
    unit = _check_str(rc, "unit", path, ln("unit"), f"{base}.unit", required=True)
    if not qmod.is_known_unit(unit):
        raise _err(f"unknown unit {unit!r}; known: {qmod.KNOWN_UNITS_HELP}", path, ln("unit"), f"{base}.unit")
    try:
        qmod.unit_factor(q.unit, unit)
    except ValueError:
        # a declared bridge between the families (elements and bytes) through an input of the claim
        bridge = qmod.bridge_between(q.unit, unit)
        if bridge is None or q.input(bridge.per) is None:
            raise _err(f"unit {unit!r} cannot measure {qname}, whose unit is {q.unit!r}", path, ln("unit"),
                       f"{base}.unit") from None

    # claimed
    if "claimed" not in rc:
        raise _err("missing required field 'claimed'", path, header, f"{base}.claimed")
    raw_claimed = lines.raw_claimed[i] if i < len(lines.raw_claimed) else None
    claimed, ctext, step = _claimed(rc["claimed"], q, unit, raw_claimed, path, ln("claimed"), f"{base}.claimed")

    # a size or a count is never negative: a negative figure (a -1 sentinel) is bad input, not a figure to judge
    family = qmod.unit_family(unit) or ""
    figures = claimed if isinstance(claimed, tuple) else (claimed,)
    if (family in ("bytes", "bandwidth", "bytes_per_param") or family.startswith("count:")) and \
            any(isinstance(x, Fraction) and x < 0 for x in figures):
        raise _err(f"claimed={ctext} {unit} is negative: a size or a count is >= 0 (a -1 sentinel is not a figure)",
                   path, ln("claimed"), f"{base}.claimed")

    # rounding
    step_inferred = True
    if "rounding" in rc:
        raw_r = lines.raw_rounding[i] if i < len(lines.raw_rounding) else None
        r = _number(rc["rounding"], "rounding", path, ln("rounding"), f"{base}.rounding", raw=raw_r)
        if r.value < 0:
            raise _err(f"rounding must be >= 0, got {r.text}", path, ln("rounding"), f"{base}.rounding")
        step, step_inferred = r.value, False
        figures = claimed if isinstance(claimed, tuple) else (claimed,)
        if step and any((x / step).denominator != 1 for x in figures):
            raise _err(f"rounding = {r.text} must divide the printed figure {ctext} (a figure rounded to the "
                       f"nearest {r.text} is a multiple of it)", path, ln("rounding"), f"{base}.rounding")

    note = _check_str(rc, "note", path, ln("note"), f"{base}.note", required=False)
    section = _check_str(rc, "section", path, ln("section"), f"{base}.section", required=False)
    expect = None
    if "expect" in rc:
        expect = rc["expect"]
        if not isinstance(expect, str) or expect not in VERDICTS:
            raise _err(f"expect must be one of {', '.join(VERDICTS)}, got {expect!r}", path, ln("expect"),
                       f"{base}.expect")
    return Claim(cid, qname, dict(inputs), claimed, ctext, unit, step, step_inferred, note, section, expect,
                 i, header, dict(cl), alias)




def _check(rk: Any, i: int, kl: dict, path: str, ids: dict[str, int | None], claim_ids: set[str]) -> Check:
    header = kl.get("__header__")
    cid, base, ln = _table_head(rk, "check", i, kl, _CHECK_FIELDS, path, ids)
    kind = _check_str(rk, "kind", path, ln("kind"), f"{base}.kind", required=True)
    if kind not in CHECK_KINDS:
        raise _err(f"kind must be one of {', '.join(CHECK_KINDS)}, got {kind!r}", path, ln("kind"), f"{base}.kind")
    total = None
    if kind in ("sum", "product"):
        total = _check_str(rk, "total", path, ln("total"), f"{base}.total", required=True)
        if total not in claim_ids:
            raise _err(f"total {total!r} is not a claim id of this key", path, ln("total"), f"{base}.total")
    elif "total" in rk:
        raise _err("an 'equal' check has no total; list every claim in parts", path, ln("total"), f"{base}.total")
    parts = rk.get("parts")
    if not isinstance(parts, list) or not parts or len(parts) > _MAX_ARRAY:
        raise _err("parts must be a non-empty list of claim ids or numbers", path, ln("parts"), f"{base}.parts")
    out: list[str | Fraction] = []
    for p in parts:
        if isinstance(p, str) and p in claim_ids:
            out.append(p)
        elif isinstance(p, str) and parse_printed(p) is None:
            raise _err(f"part {p!r} is not a claim id of this key", path, ln("parts"), f"{base}.parts")
        else:
            out.append(_number(p, "part", path, ln("parts"), f"{base}.parts").value)
    if kind == "equal" and sum(isinstance(p, str) for p in out) < 1:
        raise _err("an 'equal' check needs at least one claim id", path, ln("parts"), f"{base}.parts")
    if kind in ("sum", "product") and len(out) < 1:
        raise _err("needs at least one part", path, ln("parts"), f"{base}.parts")
    note = _check_str(rk, "note", path, ln("note"), f"{base}.note", required=False)
    section = _check_str(rk, "section", path, ln("section"), f"{base}.section", required=False)
    expect = rk.get("expect")
    if expect is not None and (not isinstance(expect, str) or expect not in CHECK_VERDICTS):
        raise _err(f"expect must be one of {', '.join(CHECK_VERDICTS)}, got {expect!r}", path, ln("expect"),
                   f"{base}.expect")
    return Check(cid, kind, total, tuple(out), note, section, expect, header)


