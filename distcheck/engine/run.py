"""``run_all``: everything the properties stage of ``distcheck check`` runs, one row each.

It looks up :func:`run_suite` here and ``kill_mutants`` / ``prove_all`` on their modules at
call time, so a test may replace any of them.
"""

from __future__ import annotations

from distcheck.core.results import CheckResult
from distcheck.engine import mutants as mutants_module
from distcheck.engine import proofs as proofs_module
from distcheck.engine.runner import resolve_seed, run_suite

__all__ = ["run_all"]


def run_all(profile: str = "ci", *, mutants: bool = True, proofs: bool = True,
            seed: int | None = None) -> list[CheckResult]:
    """Every property (backend "reference"), every sympy proof (backend "sympy"), every
    mutant ("mutant:<name>", pass = killed) and a final "mutants killed k/n" row.

    ``seed``: the run seed (:func:`~distcheck.engine.runner.resolve_seed`), shared by every
    property and mutant row and recorded in their ``extra["seed"]``; the same profile and seed
    give the same rows.
    """
    seed = resolve_seed(profile, seed)
    rows = run_suite(None, profile, seed=seed)
    if proofs:
        rows += proofs_module.prove_all()
    if mutants:
        killed = mutants_module.kill_mutants(profile, seed=seed)
        summary = mutants_module.mutant_summary(killed)
        summary.extra.update(seed=seed, profile=profile)
        rows += [*killed, summary]
    return rows
