"""Symbolic proofs (sympy) of identities between closed forms, for every value of the symbols.

A proof is a function of no arguments returning ``(holds, detail)``; the parallelism
packages' ``proofs`` modules register theirs with the :func:`proof` decorator, and
:func:`prove_all` returns one :class:`distcheck.core.results.CheckResult` row per proof
(backend ``"sympy"``, examples 1), in package order, each package's proofs in the order
its module defines them.

Symbols are declared as the catalogue's forms declare theirs (positive integers: p, m, v,
t_f, t_b, N_d, Psi, n, sizes; flags as integers), so simplification may use that. The
helpers :func:`zero` and :func:`same_symbols` are what proofs share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy as sp

from distcheck.core.closed_form import ClosedForm
from distcheck.core.results import FAIL, PASS, CheckResult
from distcheck.engine.discovery import role_modules

__all__ = ["PROOFS", "Proof", "proof", "load", "prove", "prove_all", "zero", "on_symbols_of"]

#: what a proof returns: whether the identity holds, and one line saying what was shown
Proof = Callable[[], tuple[bool, str]]

#: proof name -> function returning (holds, detail), filled by the packages' proofs modules
PROOFS: dict[str, Proof] = {}
_loaded = False


def proof(name: str) -> Callable[[Proof], Proof]:
    """Decorator: register the function as the proof ``name`` (``"proof.<suite>.<identity>"``).
    Raises ValueError when another function is registered under the same name."""

    def register(fn: Proof) -> Proof:
        if name in PROOFS and PROOFS[name] is not fn:
            raise ValueError(f"proof {name!r} registered twice")
        PROOFS[name] = fn
        return fn

    return register


def load() -> dict[str, Proof]:
    """:data:`PROOFS`, after every package's ``proofs`` module has been imported."""
    global _loaded
    if not _loaded:
        role_modules("proofs")
        _loaded = True
    return PROOFS


def zero(expr: Any) -> bool:
    """True when sympy simplifies ``expr`` to 0."""
    return bool(sp.simplify(expr) == 0)


def on_symbols_of(form: ClosedForm, other: ClosedForm) -> sp.Expr:
    """``other``'s expression with its symbols replaced by ``form``'s symbols of the same name
    (two forms declare equal-named inputs separately)."""
    return other.expr.subs({other.symbols[k]: form.symbols[k] for k in other.symbols if k in form.symbols})


def prove(name: str) -> CheckResult:
    """Run one proof; a proof that raises is a FAIL row with the error as detail."""
    try:
        holds, detail = load()[name]()
    except Exception as e:  # noqa: BLE001 - report, do not crash the check run
        holds, detail = False, f"{type(e).__name__}: {e}"
    return CheckResult(check=name, backend="sympy", verdict=PASS if holds else FAIL, examples=1, detail=detail)


def prove_all() -> list[CheckResult]:
    """Every proof of :data:`PROOFS`, one row each (backend "sympy", examples 1)."""
    return [prove(name) for name in load()]
