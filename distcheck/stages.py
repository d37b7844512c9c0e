"""The stages of ``distcheck check`` and the one orchestration that runs them.

A *stage* is a named group of checks (``--only``, ``--skip``), declared once in :data:`STAGES`:
``properties`` (Hypothesis properties, sympy proofs, mutants; ``--profile``, ``--seed``),
``golden`` (the answer keys) and ``certify`` (the targets of ``[tool.distcheck]`` in the current
folder's ``pyproject.toml``; no rows without one) are pure; ``distributed`` (data parallelism)
and ``layers`` (ZeRO, FSDP2, tensor parallel, pipelining, DeviceMesh, collective bytes) need a
world, and their checks are the parallelism packages' ``checks`` modules, found by discovery.

Two launchers run them:

* :func:`run_local` (``distcheck check``): the stages in order, with a progress bar. The world
  stages share one :class:`~distcheck.runners.pool.RankPool` per world size, started on first
  use (:class:`LocalWorlds`).
* :func:`run_torchrun` (``--launcher torchrun``): this process is one rank of a torchrun
  launch. Rank 0 runs the world-free checks before joining (the fake backend needs a process
  without a process group), every rank runs the world stages through one
  :class:`~distcheck.runners.torchrun_world.TorchrunWorld`, rank 0 alone runs the pure
  stages and prints the report, and every rank exits with rank 0's code.

Both label known upstream discrepancies (:func:`distcheck.runners.findings.label_findings`),
turn a stage that raises a :class:`~distcheck.core.errors.DistcheckError` into one ``FAIL`` row
named after it, and print :func:`distcheck.report.print_report`.

Extension points (``cli.py`` and ``runners/torchrun.py`` need no change):

* a new stage: one more :class:`Stage` in :data:`STAGES` (its name becomes a choice of
  ``--only``/``--skip``);
* real-backend checks of a parallelism: a module ``distcheck.parallel.<name>.checks``
  (:data:`PARALLEL_PACKAGE`) is found by :func:`discover_checks` and joins a declared world
  stage. It defines ``world_rows(world, *, timeout_s)`` (rows from one world, a
  :class:`~distcheck.engine.world.World`), ``world_free_rows()`` (rows that need torch but
  no world) and/or ``CERTIFY``: contract runs
  (:class:`~distcheck.engine.contracts.contract.ContractRun`, a contract with torch's own
  implementation as its target) that the stage certifies on each world through the certify
  engine (:mod:`distcheck.certify.runs`), one row per property with its example count.
  Optionally ``STAGE`` (``"layers"``, the default, or ``"distributed"``), ``PRELOAD``
  (modules a pool's parent imports before forking) and ``skip_rows(world_size, backend,
  reason)`` (its rows for a world the backend cannot run here). It never starts a world.

Importing this module imports neither torch nor sympy.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from distcheck.core.errors import BackendUnavailable, ConfigError, DistcheckError
from distcheck.core.results import check_exit_code, say_nothing_can_fail
from distcheck.core.validate import check_choice
from distcheck.report import FAIL, SKIP, CheckResult

if TYPE_CHECKING:
    from distcheck.engine.world import LaunchedWorld, World
    from distcheck.runners.worlds import LocalWorlds

__all__ = ["PARALLEL_PACKAGE", "STAGES", "CheckOptions", "Stage", "WorldChecks", "discover_checks",
           "run_local", "run_stages", "run_torchrun", "select_stages", "stage", "stage_names", "stage_table",
           "world_free_stage_rows"]

#: the package whose sub-packages' ``checks`` modules :func:`discover_checks` collects
PARALLEL_PACKAGE = "distcheck.parallel"

Rows = list[CheckResult]


@dataclass(frozen=True)
class CheckOptions:
    """The options of ``distcheck check`` a stage may read.

    Attributes:
        profile: Hypothesis settings profile, ``"dev"``, ``"ci"`` or ``"thorough"`` (None: ci).
        seed: seed of the properties stage, an int >= 0 (None: the profile's default).
        backend: ``"gloo"``, ``"threaded"``, ``"nccl"`` or ``"none"`` (no world stage).
        world_sizes: ranks of each local world (ignored under torchrun).
        timeout_s: timeout of each multi-process step, seconds.
        golden_dir: folder of golden answer keys (None: the shipped ones).
    """

    profile: str | None = None
    seed: int | None = None
    backend: str = "gloo"
    world_sizes: tuple[int, ...] = (2, 4)
    timeout_s: float = 120.0
    golden_dir: Path | str | None = None

    @classmethod
    def from_args(cls, args: Any) -> Self:
        """From a parsed ``check`` namespace; a missing attribute takes its default."""
        return cls(profile=getattr(args, "profile", None), seed=getattr(args, "seed", None),
                   backend=getattr(args, "backend", "gloo"),
                   world_sizes=tuple(getattr(args, "world_sizes", None) or (2, 4)),
                   timeout_s=float(getattr(args, "timeout", 120.0)), golden_dir=getattr(args, "golden_dir", None))


@dataclass(frozen=True)
class WorldChecks:
    """One contribution of real-backend checks to a world stage.

    Attributes:
        name: what the checks are (``"ddp"``, ``"layers"``, a parallelism package's name).
        world_rows: rows from one world, ``world_rows(world, options)``; None if it has none.
        world_free_rows: rows that need torch but no world, ``world_free_rows(options)``; run
            once per stage (under torchrun by rank 0, before it joins the world).
        unavailable_rows: the rows for a world size the backend cannot run here,
            ``unavailable_rows(world_size, options, reason)`` (default: one ``skip`` row).
        preload: modules a pool's parent imports before forking its ranks (the pool's ``preload``).
    """

    name: str
    world_rows: Callable[[World, CheckOptions], Rows] | None = None
    world_free_rows: Callable[[CheckOptions], Rows] | None = None
    unavailable_rows: Callable[[int, CheckOptions, str], Rows] | None = None
    preload: tuple[str, ...] = ()

    def skip_rows(self, world_size: int, options: CheckOptions, reason: str) -> Rows:
        """The rows for a world of ``world_size`` ranks that ``options.backend`` cannot run here."""
        if self.world_rows is None:
            return []
        if self.unavailable_rows is not None:
            return self.unavailable_rows(world_size, options, reason)
        return [CheckResult(self.name, options.backend, SKIP, world_size, 0, detail=reason)]


@dataclass(frozen=True)
class Stage:
    """A stage of ``distcheck check``.

    Attributes:
        name: the name ``--only`` and ``--skip`` take.
        title: what the progress display and a stage's FAIL row call it; ``{backend}`` is
            replaced by the backend (``"DDP on {backend}"``).
        needs_world: True for a stage whose checks run on real worlds (``checks``); False for
            a pure one (``run``), which under torchrun runs on rank 0 alone.
        run: a pure stage's rows, ``run(options)``.
        checks: a world stage's contributions (more join it by discovery, :func:`stage_table`).
        idle: why the stage gave no rows, ``idle(options)`` (``"nothing to certify: ..."``): what
            ``distcheck check`` says of it instead of a count of 0 checks (default ``"nothing to check"``).

    Raises ConfigError when a pure stage has no ``run`` or has ``checks``, or a world stage has a ``run``.
    """

    name: str
    title: str
    needs_world: bool = False
    run: Callable[[CheckOptions], Rows] | None = None
    checks: tuple[WorldChecks, ...] = ()
    idle: Callable[[CheckOptions], str] | None = None

    def __post_init__(self) -> None:
        if self.needs_world and self.run is not None:
            raise ConfigError("run", self.name, "must be None for a stage that needs a world (give its checks)")
        if not self.needs_world and (self.run is None or self.checks):
            raise ConfigError("run", self.name, "must be given, and checks empty, for a stage that needs no world")

    def label(self, options: CheckOptions) -> str:
        """The title with the backend filled in."""
        return self.title.replace("{backend}", options.backend)

    def nothing_run(self, options: CheckOptions) -> str:
        """Why the stage gave no rows under ``options`` (:attr:`idle`, else ``"nothing to check"``)."""
        return "nothing to check" if self.idle is None else self.idle(options)

    @property
    def preload(self) -> tuple[str, ...]:
        """Every module its checks ask a pool's parent to import, in order, once each."""
        return tuple(dict.fromkeys(m for c in self.checks for m in c.preload))


# ----------------------------------------------------------------------------- the stages, declared once


def _properties(options: CheckOptions) -> Rows:
    from distcheck.props import run_all

    return run_all(profile=options.profile or "ci", seed=options.seed)


def _golden(options: CheckOptions) -> Rows:
    from distcheck.golden import default_golden_dir, verify_all

    return verify_all(options.golden_dir or default_golden_dir())


def _certify_targets(options: CheckOptions) -> Rows:
    """The targets of ``[tool.distcheck]`` in the current folder's ``pyproject.toml``, certified with
    the settings of that table (``--profile`` and ``--seed`` override its own); none: no rows."""
    path = Path.cwd() / "pyproject.toml"
    if options.backend == "none" or not path.is_file():
        return []
    from distcheck.certify.config import config_rows

    return config_rows(path, profile=options.profile, seed=options.seed)


def _certify_idle(options: CheckOptions) -> str:
    """Why :func:`_certify_targets` gave no rows."""
    if options.backend == "none":
        return "not run (--backend none runs no target)"
    if not (Path.cwd() / "pyproject.toml").is_file():
        return "nothing to certify (no pyproject.toml in the current folder)"
    return "nothing to certify (no [[tool.distcheck.certify]] entries in ./pyproject.toml)"


#: the stages of ``distcheck check``, in the order they run (add a stage here); the world stages'
#: checks are found by discovery (:func:`stage_table`)
STAGES: tuple[Stage, ...] = (
    Stage("properties", "properties", run=_properties),
    Stage("golden", "golden figures", run=_golden),
    Stage("distributed", "DDP on {backend}", needs_world=True),
    Stage("layers", "layers on {backend}", needs_world=True),
    Stage("certify", "certify targets of pyproject.toml", run=_certify_targets, idle=_certify_idle),
)


def stage_names(*, needs_world: bool | None = None) -> tuple[str, ...]:
    """Names of the declared stages, in order (only those that need a world, or only the pure ones)."""
    return tuple(s.name for s in STAGES if needs_world is None or s.needs_world == needs_world)


def discover_checks(package: str | None = None) -> list[tuple[str, WorldChecks]]:
    """``(stage name, checks)`` for every ``<package>.<name>.checks`` module, by package name.

    ``package`` defaults to :data:`PARALLEL_PACKAGE`; a package that does not exist has
    no checks. The protocol of a checks module is in this module's docstring.

    Raises ConfigError for a checks module with neither ``world_rows``, ``world_free_rows`` nor
    ``CERTIFY``, or a ``STAGE`` that is not a declared world stage; and whatever importing a
    checks module raises (a broken module is not skipped).
    """
    package = PARALLEL_PACKAGE if package is None else package
    try:
        root = importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (package == exc.name or package.startswith(exc.name + ".")):
            return []
        raise
    found = []
    for info in sorted(pkgutil.iter_modules(getattr(root, "__path__", []), package + "."), key=lambda i: i.name):
        if not info.ispkg or importlib.util.find_spec(info.name + ".checks") is None:
            continue
        module = importlib.import_module(info.name + ".checks")
        found.append(_checks_of(module, info.name.rpartition(".")[2]))
    return found


def _checks_of(module: Any, name: str) -> tuple[str, WorldChecks]:
    world_rows, world_free_rows = getattr(module, "world_rows", None), getattr(module, "world_free_rows", None)
    runs = tuple(getattr(module, "CERTIFY", ()))
    if world_rows is None and world_free_rows is None and not runs:
        raise ConfigError(module.__name__, None, "must define world_rows(world, *, timeout_s), world_free_rows() "
                                                 "or CERTIFY")
    stage = check_choice(f"{module.__name__}.STAGE", getattr(module, "STAGE", "layers"), stage_names(needs_world=True))
    skip_rows = getattr(module, "skip_rows", None)

    def on_world(world: World, options: CheckOptions) -> Rows:
        rows = [] if world_rows is None else list(world_rows(world, timeout_s=options.timeout_s))
        if runs:
            from distcheck.certify.runs import contract_rows

            rows += contract_rows(world, runs, profile=options.profile, seed=options.seed,
                                  timeout_s=options.timeout_s)
        return rows

    def unavailable(world_size: int, options: CheckOptions, reason: str) -> Rows:
        rows = [] if skip_rows is None else list(skip_rows(world_size, options.backend, reason))
        if runs:
            from distcheck.certify.runs import unavailable_rows

            rows += unavailable_rows(runs, world_size, options.backend, reason)
        return rows or [CheckResult(name, options.backend, SKIP, world_size, 0, detail=reason)]

    return stage, WorldChecks(
        name,
        world_rows=on_world if world_rows is not None or runs else None,
        world_free_rows=None if world_free_rows is None else lambda options: world_free_rows(),
        unavailable_rows=unavailable,
        preload=tuple(getattr(module, "PRELOAD", ())),
    )


def stage_table(package: str | None = None) -> list[Stage]:
    """The declared stages, each world stage with the checks :func:`discover_checks` found for it."""
    extra: dict[str, list[WorldChecks]] = {}
    for stage_name, checks in discover_checks(package):
        extra.setdefault(stage_name, []).append(checks)
    return [replace(s, checks=s.checks + tuple(extra.get(s.name, ()))) if s.needs_world else s for s in STAGES]


def stage(name: str, package: str | None = None) -> Stage:
    """The stage called ``name`` with its checks (:func:`stage_table`); ConfigError for an unknown name."""
    check_choice("stage", name, stage_names())
    return next(s for s in stage_table(package) if s.name == name)


def world_free_stage_rows(name: str, options: CheckOptions | None = None) -> Rows:
    """The rows of stage ``name`` that need torch but no world, findings labelled (run them in a
    process without a default process group)."""
    return _world_free(stage(name), options or CheckOptions())


def select_stages(only: Iterable[str] | None = None, skip: Iterable[str] | None = None,
                  backend: str = "gloo") -> list[Stage]:
    """The stages to run, in order: ``only`` (default all) less ``skip``; none that needs a world
    when ``backend == "none"``. Raises ConfigError naming a stage that is not declared."""
    names = stage_names()
    for field_name, given in (("only", only), ("skip", skip)):
        for name in given or ():
            check_choice(field_name, name, names)
    chosen = set(only) if only else set(names)
    chosen -= set(skip or ())
    if backend == "none":
        chosen -= set(stage_names(needs_world=True))
    return [s for s in stage_table() if s.name in chosen]


# ----------------------------------------------------------------------------- rows of one stage


def _guarded(stage: Stage, options: CheckOptions, rows: Callable[[], Rows]) -> Rows:
    """``rows()``, or one FAIL row named after the stage when it raises a DistcheckError."""
    try:
        return rows()
    except DistcheckError as exc:
        return [CheckResult(check=stage.label(options), backend="-", verdict=FAIL, detail=str(exc).splitlines()[0])]


def _labelled(rows: Rows) -> Rows:
    from distcheck.runners.findings import label_findings

    return label_findings(rows)


def _world_free(stage: Stage, options: CheckOptions) -> Rows:
    return _labelled([r for c in stage.checks if c.world_free_rows is not None for r in c.world_free_rows(options)])


def _on_world(stage: Stage, options: CheckOptions, world: World) -> Rows:
    return _labelled([r for c in stage.checks if c.world_rows is not None for r in c.world_rows(world, options)])


def _pure(stage: Stage, options: CheckOptions) -> Rows:
    return [] if stage.run is None else stage.run(options)


def _local_stage(stage: Stage, options: CheckOptions, worlds: LocalWorlds) -> Rows:
    if not stage.needs_world:
        return _pure(stage, options)
    rows = _world_free(stage, options)
    if any(c.world_rows is not None for c in stage.checks):
        for ws in options.world_sizes:
            try:
                world = worlds.get(ws)
            except BackendUnavailable as exc:
                rows += _labelled([r for c in stage.checks for r in c.skip_rows(ws, options, str(exc))])
                continue
            rows += _on_world(stage, options, world)
    return rows


def run_stages(stages: Sequence[Stage], options: CheckOptions, *, on_start: Callable[[Stage], None] | None = None,
               on_end: Callable[[Stage, Rows, float], None] | None = None) -> Rows:
    """Run ``stages`` in order on local worlds (one pool per world size, shared); return every row.

    ``on_start(stage)`` and ``on_end(stage, rows, seconds)`` are called around each stage.
    The pools are closed before this returns or raises.
    """
    from distcheck.runners.worlds import LocalWorlds

    preload = tuple(dict.fromkeys(m for s in stages for m in s.preload))
    rows: Rows = []
    with LocalWorlds(options.backend, options.timeout_s, preload) as worlds:
        for stage in stages:
            if on_start is not None:
                on_start(stage)
            t0 = time.perf_counter()
            got = _guarded(stage, options, partial(_local_stage, stage, options, worlds))
            rows += got
            if on_end is not None:
                on_end(stage, got, time.perf_counter() - t0)
    return rows


# ----------------------------------------------------------------------------- the two launchers


def run_local(args: Any) -> int:
    """``distcheck check``: run the selected stages here, print the report; return the exit code.

    ``args`` is the parsed ``check`` namespace (``only``, ``skip``, ``backend``,
    ``world_sizes``, ``timeout``, ``profile``, ``seed``, ``golden_dir``, ``format``, and
    optionally ``quiet`` and ``report``, a folder for the HTML and Markdown reports).
    Returns 1 when a row failed, else 2 when nothing could fail (:func:`check_exit_code`), else 0.
    """
    from rich.console import Console

    from distcheck.progress import Progress
    from distcheck.report import print_report

    options = CheckOptions.from_args(args)
    stages = select_stages(getattr(args, "only", None), getattr(args, "skip", None), options.backend)
    quiet = bool(getattr(args, "quiet", False))
    console = Console(stderr=True, log_path=False)
    started = time.perf_counter()
    bar = Progress("distcheck check", total=len(stages), quiet=quiet, console=console)

    def on_start(stage: Stage) -> None:
        bar.update(description=f"[bold]distcheck check[/]: {stage.label(options)}")

    def on_end(stage: Stage, rows: Rows, seconds: float) -> None:
        bar.advance()
        if not quiet:
            done = f"{len(rows)} checks in {seconds:.1f}s" if rows else stage.nothing_run(options)
            console.log(f"{stage.label(options)}: {done}", markup=False)  # a path may hold [brackets]

    with bar:
        rows = run_stages(stages, options, on_start=on_start, on_end=on_end)
    seconds = time.perf_counter() - started
    print_report(rows, seconds=seconds, fmt=getattr(args, "format", "table"))
    say_nothing_can_fail(rows)
    report = getattr(args, "report", None)
    if report is not None:
        from distcheck.reportdoc import write_check_report

        write_check_report(report, rows, seconds=seconds,
                           notes=[(f"stages: {', '.join(s.name for s in stages)}; backend {options.backend}, "
                                   f"world sizes {', '.join(map(str, options.world_sizes))}")])
    return check_exit_code(rows)



def run_torchrun(args: Any, environ: Any = None, *, world: LaunchedWorld | None = None) -> int:
    """``distcheck check --launcher torchrun``: this process is one rank of a torchrun launch.

    ``args`` is the parsed ``check`` namespace: ``backend`` (``"gloo"`` or ``"nccl"``;
    ``"none"`` runs no world stage; ``"threaded"`` is refused), ``timeout`` (seconds, the
    process group's collective timeout), ``format`` (``"table"`` or ``"json"``),
    ``only``/``skip`` (stages), and optionally ``profile``, ``seed`` and ``golden_dir``.
    ``world_sizes`` is ignored: the world is what torchrun launched. ``world`` replaces the
    :class:`~distcheck.runners.torchrun_world.TorchrunWorld` built from ``environ``.

    Rank 0 runs the world-free checks before joining; every rank runs the world stages
    through the one world; rank 0 alone runs the pure stages and prints the report. The
    exit code (0 pass, 1 a FAIL row, 2 nothing could fail) is rank 0's, broadcast so that every rank returns the
    same one; if the broadcast itself fails every rank returns 1.

    Raises:
        ConfigError: not launched by torchrun (``RANK`` etc. missing), or ``backend="threaded"``.
    """
    from distcheck.report import print_report
    from distcheck.runners.torchrun_world import FINAL_EXCHANGE_TIMEOUT_S, TorchrunWorld

    backend = check_choice("backend", getattr(args, "backend", "gloo"), ("gloo", "nccl", "none", "threaded"))
    if backend == "threaded":
        raise ConfigError("backend", backend, "cannot run under torchrun (one process per rank): use gloo or nccl")
    options = CheckOptions.from_args(args)
    stages = select_stages(getattr(args, "only", None), getattr(args, "skip", None), backend)
    started = time.perf_counter()
    if world is None:
        world = TorchrunWorld(backend="gloo" if backend == "none" else backend, timeout_s=args.timeout,
                              environ=environ)
    with_world = [s for s in stages if s.needs_world]
    rows: Rows = []
    if world.rank == 0:
        for s in with_world:
            rows += _guarded(s, options, partial(_world_free, s, options))
    code = 1
    try:
        world.start()
        share = world.rank0_broadcaster(FINAL_EXCHANGE_TIMEOUT_S)  # waits for rank 0's pure stages
        for s in with_world:
            rows += _guarded(s, options, partial(_on_world, s, options, world))
        if world.rank == 0:
            for s in stages:
                if not s.needs_world:
                    rows += _guarded(s, options, partial(_pure, s, options))
        try:
            code = int(share(check_exit_code(rows)))
        except Exception as exc:  # noqa: BLE001 - every rank then reports failure
            sys.stderr.write(f"distcheck: rank {world.rank}: exit code exchange failed: {exc}\n")
            rows.append(CheckResult("torchrun.exit_code_exchange", world.backend, FAIL, world.world_size, 0,
                                    detail=str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
            code = 1
        if world.rank == 0:
            print_report(rows, title=f"distcheck check (torchrun, {world.backend}, world_size={world.world_size})",
                         seconds=time.perf_counter() - started, fmt=getattr(args, "format", "table"),
                         suffix=f" (rank 0 of {world.world_size})")
            say_nothing_can_fail(rows)
    finally:
        world.close()
    return code
