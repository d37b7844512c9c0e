"""Symbolic proofs (sympy) of identities between closed forms: public path of the proof engine.

Each parallelism package registers its proofs in its ``proofs`` module
(``distcheck/parallel/<name>/proofs.py``) with :func:`distcheck.engine.proofs.proof`;
:data:`PROOFS` holds every one, found by discovery, and :func:`prove_all` returns one
:class:`distcheck.report.CheckResult` row per proof (backend ``"sympy"``).
"""

from distcheck.engine.proofs import PROOFS, load, prove, prove_all

__all__ = ["PROOFS", "prove", "prove_all"]

load()  # every package's proofs, so that PROOFS is whole when imported from here
