"""``distcheck libs``: certify real libraries, the memory estimators and rank layouts of DeepSpeed,
accelerate, Megatron-core and torchtitan, and fold the verdicts into the README's table.

The contracts are the certify framework's (:mod:`distcheck.parallel.memory.contracts`:
``memory-estimator``, ``memory-estimator-stages``; :mod:`distcheck.parallel.layout.contracts`:
``rank-layout``, ``bad-input``), all world-free. The targets are the adapters of
:mod:`distcheck.libs.targets`, module-level objects that import their library lazily, so each
can also be certified alone (``distcheck certify distcheck.libs.targets.deepspeed:ZERO2
--contract memory-estimator``).

:func:`run_libs` certifies every target of the chosen libraries and returns one
:class:`distcheck.report.CheckResult` per property, named ``libs.<target>.<property>``, with
the recorded upstream discrepancies (:mod:`distcheck.libs.findings`) labelled ``finding``;
:func:`distcheck.libs.table.summary_rows` folds them into one row per target, the README's
table "What distcheck finds in real libraries". ``distcheck libs`` is the command
(:mod:`distcheck.libs.cli`). The libraries come from the optional extra: ``pip install
'distcheck[libs]'``.
"""

from __future__ import annotations

from distcheck.core.results import FAIL, PASS, SKIP, CheckResult
from distcheck.core.validate import check_choice, check_nonnegative_int, check_positive_int

__all__ = ["run_libs", "TARGET_NAMES", "DEFAULT_EXAMPLES", "PROFILE"]

TARGET_NAMES = ("deepspeed", "accelerate", "megatron", "torchtitan")
#: Hypothesis examples per property (each third-party call is cheap; the layout examples build meshes)
DEFAULT_EXAMPLES = 60
#: the settings profile of every certification: seeded, not derandomized, so that ``--seed`` replays a run
PROFILE = "dev"


def run_libs(targets=None, *, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0,
             require_installed: bool = False) -> list[CheckResult]:
    """The contract rows of ``targets`` (default: all of :data:`TARGET_NAMES`), findings labelled.

    Each adapter's targets are certified under their contracts (:func:`distcheck.certify.certify`,
    profile :data:`PROFILE`, ``max_examples`` per property, ``seed``). A target whose library is not
    installed gives one ``skip`` row naming the install command, or a ``FAIL`` row with
    ``require_installed`` (so that a CI job cannot pass having checked nothing). A target whose module
    does not import is a skip naming what to install (an adapter's ``extra_rows(required=...)``,
    :func:`distcheck.engine.findings.not_loaded`; a FAIL under ``require_installed`` only when the extra
    should have provided it), never a finding. Raises ConfigError
    for an unknown target name or bad counts.
    """
    from distcheck.libs.findings import label
    from distcheck.libs.targets import dist_version, target

    names = tuple(TARGET_NAMES if targets is None else targets)
    for name in names:
        check_choice("target", name, TARGET_NAMES)
    check_positive_int("max_examples", max_examples)
    check_nonnegative_int("seed", seed)
    rows: list[CheckResult] = []
    for name in names:
        mod = target(name)
        if dist_version(mod.DIST) is None:
            why = f"{mod.DIST} is not installed (pip install 'distcheck[libs]')"
            rows.append(CheckResult(check=f"libs.{name}", backend="-", verdict=FAIL if require_installed else SKIP,
                                    detail=why, extra={"target": name}))
            continue
        mine: list[CheckResult] = []
        for attr, contract in mod.CERTIFY:
            mine += certified_rows(f"{mod.__name__}:{attr}", contract, max_examples=max_examples, seed=seed)
        extra_rows = getattr(mod, "extra_rows", None)
        mine += extra_rows(required=require_installed) if extra_rows is not None else []
        for row in mine:
            row.extra.setdefault("target", name)
        rows += mine
    return label(rows)


def certified_rows(ref: str, contract: str, *, max_examples: int, seed: int) -> list[CheckResult]:
    """Certify ``ref`` (``module:object``) under ``contract``; one row per property, ``libs.<name>.<property>``.

    A pass's detail is what it found (the convention, the axes compared), a failure's its shrunk
    counterexample, a skip's its reason; ``extra`` keeps the contract, the ``distcheck certify``
    command that replays the run and, for a memory estimator's fit, the conventions it names.
    """
    from distcheck.certify import certify
    from distcheck.engine.contracts.targets import import_target
    from distcheck.libs.targets import library
    from distcheck.parallel.memory.estimators import Estimator, named_conventions

    obj = import_target(ref)[0]
    cert = certify(ref, contract, examples=max_examples, seed=seed, profile=PROFILE)
    command = (f"distcheck certify {ref} --contract {contract} --seed {seed} --profile {PROFILE} "
               f"--examples {max_examples}")
    rows = []
    for v in cert.verdicts:
        extra: dict = {"contract": contract, "reproduce": v.reproduce or command}
        if isinstance(obj, Estimator) and v.property == "fit" and v.verdict == PASS:
            extra["conventions"] = [c.short for c in named_conventions(obj)]
        detail = (v.note or v.statement) if v.verdict == PASS else (v.failure or "")
        backend = library(obj.distribution) if obj.distribution else "distcheck"
        rows.append(CheckResult(check=f"libs.{obj.name}.{v.property}", backend=backend,
                                verdict=v.verdict, world_size=v.world_size, examples=v.examples,
                                max_error=v.max_error, bound=v.bound, detail=detail, extra=extra))
    return rows
