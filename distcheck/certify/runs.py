"""Contract runs as rows of ``distcheck check``: what a package's ``checks`` module lists in
``CERTIFY`` (:class:`~distcheck.engine.contracts.contract.ContractRun`), certified on the world
the stage hands it, one row per property.

The same engine as ``distcheck certify`` (:func:`~distcheck.certify.engine.certify`): Hypothesis
draws the cases in this process, sized to the world, and every example runs on every rank of
the stage's pool; failures are shrunk through it. A row holds the property's example count,
its largest error and bound; a FAIL row's detail holds the shrunk case, the ranks at fault and
the ``distcheck certify`` command that replays it. Examples per property: the profile's
:data:`~distcheck.engine.profiles.WORLD_MAX_EXAMPLES`, or the run's ``max_examples`` where that is fewer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from distcheck.certify.certificate import Certification
from distcheck.core.errors import UnknownQuantityError
from distcheck.engine.contracts.contract import ContractRun
from distcheck.engine.world import World
from distcheck.report import PASS, SKIP, CheckResult

__all__ = ["contract_rows", "certification_rows", "unavailable_rows"]


def certification_rows(run: ContractRun, cert: Certification) -> list[CheckResult]:
    """The rows of one :class:`~distcheck.certify.certificate.Certification` of ``run``."""
    rows = []
    several = len(cert.dtypes) > 1
    def check_of(prop: str, dtype: str) -> str:
        return f"{run.name}.{prop}" + (f"[{dtype}]" if several else "")

    for v in cert.verdicts:
        check = check_of(v.property, v.dtype)
        crash = {"took_down": [check_of(p, v.dtype) for p in v.took_down]} if v.took_down else {}  # shown once
        if v.verdict == PASS:
            detail = f"{v.statement} ({v.regime}; {cert.target})"
        elif v.verdict == SKIP:
            detail = v.failure or "skip"
        else:
            detail = f"{cert.target}: {v.describe(cert.contract)}"
        rows.append(CheckResult(check=check, backend=v.backend, verdict=v.verdict, world_size=v.world_size,
                                examples=v.examples, max_error=v.max_error, bound=v.bound, detail=detail,
                                extra={"target": cert.target, "contract": cert.contract, "options": cert.options,
                                       "seed": cert.seed, "profile": cert.profile, "reproduce": v.reproduce,
                                       **crash}))
    return rows


def contract_rows(world: World, runs: Sequence[ContractRun], *, profile: str | None = None, seed: int | None = None,
                  examples: int | None = None, timeout_s: float = 120.0) -> list[CheckResult]:
    """Certify every run on ``world`` (borrowed, not closed); one row per property (and dtype).

    ``examples`` defaults to :data:`~distcheck.engine.profiles.WORLD_MAX_EXAMPLES` of ``profile``
    (default ``"ci"``), capped by a run's own ``examples``; ``seed`` to the profile's
    (:func:`~distcheck.engine.runner.resolve_seed`).
    Raises what :func:`~distcheck.certify.engine.certify` raises for bad input (an unknown
    contract or option, a target that does not import): a defect of the checks module.
    """
    from distcheck.certify.engine import certify
    from distcheck.engine.profiles import WORLD_MAX_EXAMPLES
    from distcheck.engine.runner import resolve_seed

    profile = profile or "ci"
    seed = resolve_seed(profile, seed)
    count = examples if examples is not None else WORLD_MAX_EXAMPLES[profile]
    rows: list[CheckResult] = []
    for run in runs:  # below the contract's smallest world, certify gives skip rows with its reason
        n = count if run.max_examples is None else min(count, run.max_examples)
        options, note = _on_this_world(world, run)
        cert = certify(run.target, run.contract, world=world, examples=n, seed=seed, profile=profile,
                       dtypes=run.dtypes, options=options, timeout_s=timeout_s)
        rows += [replace(r, detail=f"{r.detail}; {note}") if note else r for r in certification_rows(run, cert)]
    return rows


def _on_this_world(world: World, run: ContractRun) -> tuple[dict, str]:
    """``run``'s options, or, on a world that cannot open pools beside it (torchrun) where the contract would
    run examples on other worlds too, the contract's one-world options with the note that says so."""
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.runners.pool import RankPool

    try:
        contract = get_contract(run.contract)
    except UnknownQuantityError:  # certify raises it again, naming the contract
        return run.options, ""
    if isinstance(world, RankPool) or not contract.companion_worlds(world.world_size,
                                                                    contract.parse_options(run.options)):
        return run.options, ""
    alone = contract.one_world_options(dict(run.options))
    if alone is None:  # certify refuses it with the reason, a FAIL row of the stage
        return run.options, ""
    changed = {k: v for k, v in alone.items() if run.options.get(k, object()) != v}
    given = ", ".join(f"{k}={v}" for k, v in changed.items())
    others = contract.companion_worlds(world.world_size, contract.parse_options(run.options))
    return alone, (f"run with {given}: a {type(world).__name__} cannot open the worlds of "
                   f"{', '.join(map(str, others))} ranks beside it, so those examples were not drawn")


def unavailable_rows(runs: Sequence[ContractRun], world_size: int, backend: str, reason: str) -> list[CheckResult]:
    """One ``skip`` row per run for a world of ``world_size`` ranks that ``backend`` cannot run here."""
    return [CheckResult(run.name, backend, SKIP, world_size, 0, detail=reason) for run in runs]
