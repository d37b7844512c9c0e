"""Where a field of an answer key is: the line of each table and key, found by scanning the TOML
text (``tomllib`` gives values, not positions), so that every error names its line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__: list[str] = []


_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*(\]\]?)\s*(#.*)?$")
_KEYLINE = re.compile(r"^\s*([A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*=\s*(.*)$")


@dataclass
class _Lines:
    meta: dict = field(default_factory=dict)
    claims: list = field(default_factory=list)   # per [[claim]]: {field: line, "__header__": line}
    checks: list = field(default_factory=list)
    raw_claimed: list = field(default_factory=list)  # per [[claim]]: raw literal text of claimed/rounding
    raw_rounding: list = field(default_factory=list)


def _strip_comment(value: str) -> str:
    # a value literal up to an unquoted '#'
    out, quote = [], None
    for ch in value:
        if quote:
            out.append(ch)
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
            out.append(ch)
        elif ch == "#":
            break
        else:
            out.append(ch)
    return "".join(out).strip()


def _scan(text: str) -> _Lines:
    """Lines of the tables and fields (1-based). A hint only: never trusted for values
    unless the raw literal re-parses to the value tomllib returned."""
    found = _Lines()
    current: dict | None = None
    current_kind = None
    prefix = ""
    in_multiline = None
    for no, line in enumerate(text.splitlines(), start=1):
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        h = _HEADER.match(line)
        if h and len(h[1]) == len(h[3]):
            name = h[2].strip().strip("\"'")
            if h[1] == "[[" and name == "claim":
                current, current_kind, prefix = {"__header__": no}, "claim", ""
                found.claims.append(current)
                found.raw_claimed.append(None)
                found.raw_rounding.append(None)
            elif h[1] == "[[" and name == "check":
                current, current_kind, prefix = {"__header__": no}, "check", ""
                found.checks.append(current)
            elif h[1] == "[" and name == "meta":
                current, current_kind, prefix = found.meta, "meta", ""
                found.meta["__header__"] = no
            elif h[1] == "[" and name in ("claim.inputs", "check.inputs") and current is not None:
                current.setdefault("inputs", no)
                prefix = "inputs."
            else:
                current, current_kind, prefix = None, None, ""
            continue
        k = _KEYLINE.match(line)
        if k and current is not None:
            key = k[1].strip("\"'")
            current.setdefault(prefix + key, no)
            value = _strip_comment(k[2])
            for q in ('"""', "'''"):
                if value.count(q) == 1:
                    in_multiline = q
            if current_kind == "claim" and not prefix:
                if key == "claimed":
                    found.raw_claimed[-1] = value
                elif key == "rounding":
                    found.raw_rounding[-1] = value
    return found


