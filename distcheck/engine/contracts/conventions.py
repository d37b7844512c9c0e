"""Failures that name conventions: when a failing value is what another named convention of the contract gives.

A contract whose options name conventions (``renormalise=true``: GShard's top-2 gates; ``aux_scale=1/E``: GShard's
``mean``) can say, on a failure, which of them the target follows: :func:`search` tries the options one value away
from the run's (each single change, then, only when no single one does, each pair of changes), keeps those under
which the failing values pass the same check (the same bound), and :func:`hint` words them::

    matches convention renormalise=true (GShard top-2, Mixtral: the kept gates divided by their sum): certify
    with --option renormalise=true

A pair is offered only when it reproduces the values and no single change does; nothing is offered when none does
(the failure is then not a known convention).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

__all__ = ["Convention", "option_text", "alternatives", "search", "hint"]


@dataclass(frozen=True)
class Convention:
    """Options one or two values away from a run's: ``changes`` ((name, value), ...) and ``labels`` (what each
    value is, with its source), in the same order."""

    changes: tuple[tuple[str, Any], ...]
    labels: tuple[str, ...]

    @property
    def named(self) -> str:
        """``renormalise=true (GShard top-2)``, two joined by "with"."""
        return " with ".join(f"{option_text(n, v)} ({label})" if label else option_text(n, v)
                             for (n, v), label in zip(self.changes, self.labels, strict=True))

    @property
    def remedy(self) -> str:
        """``--option renormalise=true`` (one per change)."""
        return " ".join(f"--option {option_text(n, v)}" for n, v in self.changes)


def option_text(name: str, value: Any) -> str:
    """``name=value`` as the command line takes it (booleans lower-case)."""
    return f"{name}={str(value).lower() if isinstance(value, bool) else value}"


def alternatives(options: Mapping[str, Any], choices: Mapping[str, Sequence[Any]]) -> Iterator[tuple[int, dict]]:
    """``(changes, options)`` one value away from ``options`` for each option of ``choices`` (its values), then
    two values away (every pair of options), in ``choices``' order."""
    singles = [(name, v) for name, values in choices.items() for v in values if v != options[name]]
    for change in singles:
        yield 1, {**options, change[0]: change[1]}
    for a, b in combinations(singles, 2):
        if a[0] != b[0]:
            yield 2, {**options, a[0]: a[1], b[0]: b[1]}


def search(options: Mapping[str, Any], choices: Mapping[str, Sequence[Any]], accepts: Callable[[dict], bool],
           labels: Mapping[tuple[str, Any], str]) -> list[Convention]:
    """The conventions (:func:`alternatives`) under which ``accepts(options)`` holds: every single change that
    does, else every pair that does (a pair only when no single change reproduces the values)."""
    found: dict[int, list[Convention]] = {1: [], 2: []}
    for size, alt in alternatives(options, choices):
        if size == 2 and found[1]:
            break
        if accepts(alt):
            changes = tuple((n, alt[n]) for n in choices if alt[n] != options[n])
            found[size].append(Convention(changes, tuple(labels.get(c, "") for c in changes)))
    return found[1] or found[2]


def hint(found: Sequence[Convention]) -> str:
    """``matches convention renormalise=true (...): certify with --option renormalise=true`` ("; or ..." for
    each further one); "" when ``found`` is empty."""
    return "; or ".join(f"{'matches convention ' if i == 0 else 'convention '}{c.named}: certify with {c.remedy}"
                        for i, c in enumerate(found))
