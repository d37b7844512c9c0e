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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distcheck.core.results import FAIL, PASS, SKIP, CheckResult
from distcheck.core.validate import check_choice, check_nonnegative_int, check_positive_int

if TYPE_CHECKING:
    from types import ModuleType

    from distcheck.libs.targets import WorldRun

__all__ = ["run_libs", "TARGET_NAMES", "DEFAULT_EXAMPLES", "PROFILE", "EXTRA"]

TARGET_NAMES = ("deepspeed", "accelerate", "megatron", "torchtitan", "transformers")
#: the optional extra of pyproject.toml that installs every target's library (``pip install 'distcheck[libs]'``)
EXTRA = "libs"
#: Hypothesis examples per property (each third-party call is cheap; the layout examples build meshes)
DEFAULT_EXAMPLES = 60
#: the settings profile of every certification: seeded, not derandomized, so that ``--seed`` replays a run
PROFILE = "dev"


def run_libs(targets: Sequence[str] | None = None, *, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0,
             require_installed: bool = False) -> list[CheckResult]:
    """The contract rows of ``targets`` (default: all of :data:`TARGET_NAMES`), findings labelled.

    Each adapter's targets are certified under their contracts (:func:`distcheck.certify.certify`,
    profile :data:`PROFILE`, ``max_examples`` per property, ``seed``). A target whose library is not
    installed gives one ``skip`` row naming the install command, or a ``FAIL`` row with
    ``require_installed`` (so that a CI job cannot pass having checked nothing). A target whose module
    does not import is a skip naming what to install (an adapter's ``extra_rows(required=...)``,
    :func:`distcheck.engine.findings.not_loaded`; a FAIL under ``require_installed`` only when the extra
    should have provided it), never a finding. An adapter's ``WORLD_CERTIFY`` runs
    (:class:`distcheck.libs.targets.WorldRun`) are certified on gloo worlds of their sizes, at most
    ``min(max_examples, run.max_examples)`` examples per property and world. Raises ConfigError
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
            why = f"{mod.DIST} is not installed (pip install 'distcheck[{EXTRA}]')"
            rows.append(CheckResult(check=f"libs.{name}", backend="-", verdict=FAIL if require_installed else SKIP,
                                    detail=why, extra={"target": name}))
            continue
        mine: list[CheckResult] = []
        for attr, contract in mod.CERTIFY:
            mine += certified_rows(f"{mod.__name__}:{attr}", contract, max_examples=max_examples, seed=seed)
        mine += world_rows(mod, getattr(mod, "WORLD_CERTIFY", ()), max_examples=max_examples, seed=seed)
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

    obj: Any = import_target(ref)[0]
    cert = certify(ref, contract, examples=max_examples, seed=seed, profile=PROFILE)
    command = (f"distcheck certify {ref} --contract {contract} --seed {seed} --profile {PROFILE} "
               f"--examples {max_examples}")
    rows = []
    for v in cert.verdicts:
        extra: dict[str, Any] = {"contract": contract, "reproduce": v.reproduce or command}
        if isinstance(obj, Estimator) and v.property == "fit" and v.verdict == PASS:
            extra["conventions"] = [c.short for c in named_conventions(obj)]
        detail = (v.note or v.statement) if v.verdict == PASS else (v.failure or "")
        backend = library(obj.distribution) if obj.distribution else "distcheck"
        rows.append(CheckResult(check=f"libs.{obj.name}.{v.property}", backend=backend,
                                verdict=v.verdict, world_size=v.world_size, examples=v.examples,
                                max_error=v.max_error, bound=v.bound, detail=detail, extra=extra))
    return rows


def world_rows(mod: ModuleType, runs: Sequence[WorldRun], *, max_examples: int, seed: int) -> list[CheckResult]:
    """Certify the ``runs`` of adapter ``mod`` on gloo worlds; one row per property and world,
    ``libs.<run.name>.<property>``, its world size in the row.

    The runs of one world size share one :class:`distcheck.runners.pool.RankPool` (forked from this
    process, the runs' ``preload`` modules imported first). A pass's detail is the property's note (or
    statement) and where it ran, a failure's the shrunk counterexample and the reason, a skip's its reason;
    ``extra["reproduce"]`` is the ``distcheck certify`` command of the property (its seed, profile, examples,
    world size and options).
    """
    from distcheck.certify import certify
    from distcheck.libs.targets import library
    from distcheck.runners.pool import RankPool

    rows = []
    for ws in sorted({w for run in runs for w in run.world_sizes}):
        mine = [run for run in runs if ws in run.world_sizes]
        preload = tuple(dict.fromkeys(m for run in mine for m in run.preload))
        with RankPool(ws, backend="gloo", timeout_s=max(run.timeout_s for run in mine), preload=preload) as pool:
            for run in mine:
                n = min(max_examples, run.max_examples)
                rows += _world_run_rows(mod, run, pool, ws, n, seed, library(mod.DIST), certify)
    return rows


def _world_run_rows(mod: ModuleType, run: WorldRun, pool: Any, ws: int, n: int, seed: int, backend: str,
                    certify: Any) -> list[CheckResult]:
    ref = f"{mod.__name__}:{run.attr}"
    opts = "".join(f" --option {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in run.options.items())
    cert = certify(ref, run.contract, world=pool, examples=n, seed=seed, profile=PROFILE, options=dict(run.options),
                   dtypes=run.dtypes, timeout_s=run.timeout_s)
    command = (f"distcheck certify {ref} --contract {run.contract} --world-sizes {ws} --seed {seed} "
               f"--profile {PROFILE} --examples {n}{opts}")
    rows = []
    for v in cert.verdicts:
        if v.verdict == PASS:
            detail = f"{v.note or v.statement} (world size {v.world_size}, {v.dtype})"
        elif v.verdict == SKIP:
            detail = v.failure or "skip"
        else:
            detail = f"{v.counterexample}: {v.failure}" if v.counterexample else (v.failure or "")
        rows.append(CheckResult(check=f"libs.{run.name}.{v.property}", backend=backend, verdict=v.verdict,
                                world_size=v.world_size, examples=v.examples, max_error=v.max_error, bound=v.bound,
                                detail=detail, extra={"contract": run.contract, "reproduce": command}))
    return rows
