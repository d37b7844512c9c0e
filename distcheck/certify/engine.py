"""The certification engine: Hypothesis in the parent, the user's object on every rank of a live world.

For each world and dtype, the contract's case strategy is sized to the world and driven by
Hypothesis in this process; every example is one ``world.run`` of the contract's rank function
(the persistent :class:`~distcheck.runners.pool.RankPool`, a torchrun world, or any object with
``run``/``world_size``/``backend``), and the contract's check compares every rank's results.
Shrinking replays examples through the same world.

All properties are checked on every example. When one fails, Hypothesis shrinks that property's
failure alone (an example is interesting when that property fails there); the properties left
are then run again from the start, so each property gets its own verdict, example count and
counterexample. A failure of another property met on any example run meanwhile (generation or
shrinking) is kept (the first one met, :class:`_Met`): should that property's own run not fail it again,
it is a FAIL with that example (not shrunk), never a pass or a skip. A rank that raises fails every
property left, with one shrunk counterexample: each of them is a FAIL whose ``took_down`` names them
all, and reports show that crash once.
A target that does not follow the contract's protocol stops the certification with a
:class:`~distcheck.engine.contracts.errors.ProtocolError` (bad input), whichever example found it.
A step that times out is shrunk like any failure and fails the target once (:mod:`distcheck.certify.hangs`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from distcheck.certify import hangs
from distcheck.certify.certificate import Certification, PropertyVerdict
from distcheck.certify.compositions import Drawn
from distcheck.certify.explain import explain_failure
from distcheck.certify.identity import code_identity
from distcheck.certify.local_constants import without_local_constants
from distcheck.certify.reproduce import reproduce_command
from distcheck.certify.worlds import Companions, Joined, companions_for, world_of_one, worlds_for
from distcheck.core.errors import ConfigError, DistributedError, RankFailure, WorldTimeout
from distcheck.core.validate import check_positive_int
from distcheck.engine.contracts.contract import Contract, Outcome, check_dtypes, get_contract
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import (
    distribution_version,
    import_target,
    package_version,
    reference_of,
)
from distcheck.engine.world import RankContext, World
from distcheck.report import FAIL, PASS, SKIP

if TYPE_CHECKING:
    pass

__all__ = ["certify", "default_seed", "run_example", "run_examples", "rank_entry", "rank_entry_batch"]


def rank_entry(ctx: RankContext, contract: Contract, target: Any, case: Any, dtype: str, options: dict) -> Any:
    """What every rank runs for one example (a module-level function, so it pickles)."""
    return contract.run_rank(ctx, target, case, dtype, options)


def rank_entry_batch(ctx: RankContext, contract: Contract, target: Any, cases: list, dtype: str, options: dict) -> list:
    """What every rank runs for a batch of examples in one world step."""
    return [contract.run_rank(ctx, target, case, dtype, options) for case in cases]


@dataclass
class _Crash:
    """A world step that failed: a rank raised, died or timed out (``hung``, with the stuck ranks' stacks)."""

    message: str
    ranks: tuple[int, ...]
    hung: bool = False
    stacks: dict[int, str] = field(default_factory=dict)
    origin: str = ""  # where it was raised (drivers.exception_origin): shrinking keeps to one origin
    timeout_s: float | None = None  # the timeout a hung step outlived


def _crash(exc: DistributedError) -> _Crash:
    from distcheck.engine.drivers import exception_line, exception_origin

    if isinstance(exc, RankFailure):
        failures = getattr(exc, "failures", None) or {exc.rank: exc.traceback_text}
        lines = [f"rank {r} raised {exception_line(text)}" for r, text in sorted(failures.items())]
        origin = "; ".join(sorted({exception_origin(text) for text in failures.values()}))
        return _Crash("; ".join(lines), tuple(sorted(failures)), origin=origin)
    if isinstance(exc, WorldTimeout):
        first = str(exc).splitlines()[0] if str(exc) else "timed out"
        return _Crash(f"the world timed out: {first}", tuple(exc.ranks), True, dict(exc.stacks), "", exc.timeout_s)
    return _Crash(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", ())


def _protocol_error(exc: DistributedError, ref: str) -> ProtocolError | None:
    """The ProtocolError a rank raised, if that is what failed (chained, or named in the traceback)."""
    if isinstance(exc.__cause__, ProtocolError):
        return exc.__cause__
    from distcheck.engine.drivers import exception_line

    for text in (getattr(exc, "failures", None) or {}).values():
        line = exception_line(text)
        if "ProtocolError: " in line:
            return ProtocolError("target", ref, "does not follow the contract's protocol: "
                                 + line.split("ProtocolError: ", 1)[1])
    return None


def run_example(world: World, contract: Contract, target: Any, case: Any, dtype: str,
                options: dict) -> dict[str, Outcome] | _Crash:
    """One example on every rank of ``world``: the contract's outcomes, or a :class:`_Crash`.

    Raises ProtocolError when a rank found that the target does not follow the protocol.
    """
    outcomes = run_examples(world, contract, target, [case], dtype, options)
    return outcomes if isinstance(outcomes, _Crash) else outcomes[0]


def run_examples(world: World, contract: Contract, target: Any, cases: list, dtype: str,
                 options: dict, timeout_s: float | None = None) -> list[dict[str, Outcome]] | _Crash:
    """Several examples in one world step (each rank runs them in order, within ``timeout_s``, default the
    world's own): one outcome dict per case, or a :class:`_Crash` when a rank failed on any of them."""
    timeout = {} if timeout_s is None else {"timeout_s": timeout_s}
    try:
        if contract.companion_worlds(world.world_size, options):  # each case on the worlds it names, in turn
            world_of = getattr(world, "world_of", None) or world_of_one(world)
            per_case = [contract.run_case(world_of, target, case, dtype, options, timeout_s) for case in cases]
            return [contract.check(case, res, world.world_size, dtype, options)
                    for case, res in zip(cases, per_case, strict=True)]
        if len(cases) == 1:
            per_rank = [[r] for r in world.run(rank_entry, contract, target, cases[0], dtype, options, **timeout)]
        else:
            per_rank = world.run(rank_entry_batch, contract, target, cases, dtype, options, **timeout)
    except DistributedError as exc:
        protocol = _protocol_error(exc, getattr(target, "ref", "?"))
        if protocol is not None:
            raise protocol from None
        return _crash(exc)
    return [contract.check(case, [res[i] for res in per_rank], world.world_size, dtype, options)
            for i, case in enumerate(cases)]


def _settings(profile: str, examples: int | None, batch: int = 1) -> settings:
    from distcheck.engine.profiles import get_profile

    base = get_profile(profile)
    if batch > 1:  # Hypothesis counts lists of ``batch`` examples
        examples = -(-(examples or base.max_examples) // batch)
    overrides: dict[str, Any] = dict(
        database=None, report_multiple_bugs=False, deadline=None,
        phases=tuple(p for p in base.phases if p is not Phase.explain),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    if examples is not None:
        overrides["max_examples"] = examples
    return settings(base, **overrides)


@dataclass
class _Stats:
    examples: int = 0
    max_error: float | None = None
    bound: float | None = None
    note: str = ""

    def add(self, o: Outcome) -> None:
        self.examples += 1
        self.note = self.note or o.note
        if o.max_error is not None:
            self.max_error = max(self.max_error or 0.0, o.max_error)
        if o.bound is not None:
            self.bound = max(self.bound or 0.0, o.bound)


@dataclass
class _Met:
    """The first failure of a property met on an example of another property's run (or while a crash or hang was
    shrunk): ``during`` says which; ``calls``: the examples that run had run then."""

    case: Any
    outcome: Outcome
    calls: int
    during: str


@dataclass
class _Run:
    remaining: list[str]
    calls: int = 0
    target: tuple | None = None  # ("crash", origin) or ("property", name)
    other: tuple | None = None  # (case, message): the first failure of another origin seen while shrinking
    first_failure: int | None = None
    last: tuple | None = None  # (case, message, ranks, outcome)
    abort: BaseException | None = None
    hang: hangs.HangState = field(default_factory=hangs.HangState)  # the steps that timed out
    stats: dict = field(default_factory=dict)
    drawn: Drawn | None = None  # the compositions drawn (every example run, with its outcomes)
    met: dict[str, _Met] = field(default_factory=dict)  # every property's first failure met (kept across runs)

    def meet(self, case: Any, outcome: dict[str, Outcome], shrunk: tuple | None, calls: int) -> tuple | None:
        """Keep the first failure of each property of ``remaining`` on ``case`` (the run's example ``calls``) but
        the one this run shrinks (``shrunk``, the run's target, or None before its first failure); return the
        target after ``case``."""
        failing, during = [p for p in self.remaining if not outcome[p].ok], ""
        if shrunk is None and failing:
            shrunk, during = ("property", failing[0]), f"on the example where {failing[0]} failed first"
        elif shrunk is not None:
            during = f"while the failure of {shrunk[1]} was shrunk" if shrunk[0] == "property" else \
                f"while a {'hang' if shrunk[0] == 'hang' else 'crash'} was shrunk"
        for p in failing:
            if p not in self.met and shrunk != ("property", p):
                self.met[p] = _Met(case, outcome[p], calls, during)
        return shrunk

def _example_test(run: _Run, world: World, contract: Contract, target: Any, dtype: str, options: dict,
                  batch: int, clock: hangs.StepClock | None = None) -> Callable[[Any], None]:
    """The body Hypothesis calls for each example (or batch of ``batch`` examples) of one run.

    Before the first failure every property of ``run.remaining`` counts the example. The first
    failure fixes the target of the run: that property (or, for a crash, the crash; for a step that
    timed out, the hang), and from then on an example is interesting only when the target fails there
    again (a hang: as :mod:`distcheck.certify.hangs` says, ``clock`` timing the world's steps). In a batch,
    the failing case is the counterexample (the others shrink to the strategy's simplest cases alongside)."""
    clock, timed = clock or hangs.StepClock(), hangs.takes_timeout(world)

    def test(drawn: Any) -> None:
        cases = drawn if batch > 1 else [drawn]
        run.calls += len(cases)
        if run.abort is not None:
            raise run.abort
        try:  # after a hang: the world warmed first, the step under a shorter timeout (hangs.HangState.step)
            outcomes = run.hang.step(lambda cs, t: run_examples(world, contract, target, cs, dtype, options, t), cases,
                                     clock, lambda o: not isinstance(o, _Crash))
        except Exception as exc:  # protocol errors and distcheck's own defects stop the run
            run.abort = exc
            raise
        if run.drawn is not None:
            run.drawn.add(cases, outcomes)
        shown = cases[0] if len(cases) == 1 else cases
        if isinstance(outcomes, _Crash):
            if outcomes.hung:  # shrunk like any failure; each later step under the shorter timeout
                return hangs.on_hang(run, shown, outcomes, clock if timed else None)
            if run.target is None:
                run.target, run.first_failure = ("crash", outcomes.origin), run.calls
            elif run.target != ("crash", outcomes.origin):  # another failure: not the one being shrunk
                run.other = run.other or (shown, outcomes.message)
                return
            run.last = (shown, outcomes.message, outcomes.ranks, None)  # a crash fails every property
            raise AssertionError(outcomes.message)
        shrunk = run.target  # every failure met is kept, on every case of a batch
        for i, (case, outcome) in enumerate(zip(cases, outcomes, strict=True)):
            shrunk = run.meet(case, outcome, shrunk, run.calls - len(cases) + i + 1)
        for case, outcome in zip(cases, outcomes, strict=True):
            if run.target is None:
                for p in run.remaining:
                    run.stats[p].add(outcome[p])
                failing = [p for p in run.remaining if not outcome[p].ok]
                if not failing:
                    continue
                run.target, run.first_failure = ("property", failing[0]), run.calls
            if run.target[0] == "property" and not outcome[run.target[1]].ok:
                failed = outcome[run.target[1]]
                run.last = (case, failed.message, failed.ranks, failed)  # the failing case of a batch
                raise AssertionError(failed.message)

    return test


def _skips(contract: Contract, dtype: str, options: dict, ws: int, backend: str, reason: str) -> list[PropertyVerdict]:
    """Every property of ``contract`` at world size ``ws`` a SKIP with ``reason``."""
    return [PropertyVerdict(p.name, contract.statement(p.name, dtype, options), p.regime, dtype, ws, backend, SKIP,
                            failure=reason) for p in contract.properties]


def _certify_dtype(world: World, contract: Contract, target: Any, dtype: str, options: dict, run_settings: settings,
                   seed: int, replay: str, batch: int = 1, compositions: list | None = None,
                   clock: hangs.StepClock | None = None) -> list[PropertyVerdict]:
    ws, backend = world.world_size, world.backend
    specs = {p.name: p for p in contract.properties}
    degenerate = contract.cannot_fail(ws, options)  # below its smallest world, no claim can fail: none is run
    strategy = None if degenerate else contract.cases_for(target, ws, dtype, options)
    if strategy is None:
        return _skips(contract, dtype, options, ws, backend, degenerate or contract.skip_reason(ws, dtype, options))
    verdicts: dict[str, PropertyVerdict] = {
        p: PropertyVerdict(p, contract.statement(p, dtype, options), specs[p].regime, dtype, ws, backend, SKIP,
                           failure=reason)
        for p, reason in contract.skipped(target, options).items() if p in specs}
    remaining = [p for p in specs if p not in verdicts]
    explained: dict[str, str] = {}
    seen = Drawn(contract, ws, dtype, [] if compositions is None else compositions, skipped=list(verdicts))
    met: dict[str, _Met] = {}  # each property's first failure met in another's run
    while remaining:
        run = _Run(remaining=list(remaining), stats={p: _Stats() for p in remaining}, drawn=seen, met=met)
        started = time.perf_counter()

        test = _example_test(run, world, contract, target, dtype, options, batch, clock)
        test.__name__ = f"certify_{contract.name}_{dtype}".replace("-", "_")
        drawn = strategy if batch == 1 else st.lists(strategy, min_size=batch, max_size=batch)
        runner = hypothesis_seed(seed)(run_settings(given(drawn)(test)))
        try:
            with without_local_constants():
                runner()
        except BaseException as exc:  # sorted out below
            if run.hang.hung is not None and (isinstance(exc, hangs.Hung) or run.target == ("hang",)
                                              and isinstance(exc, Exception)):
                seconds = time.perf_counter() - started
                verdicts.update(hangs.hung_run(run, contract, dtype, options, ws, backend, replay, seconds, exc))
                break
            if run.abort is not None:
                raise run.abort from None
            if not isinstance(exc, Exception) or run.last is None:
                raise
            case, message, ranks, outcome = run.last
            if outcome is not None:  # a property's failure: the contract may replay its final case to explain it
                why = explain_failure(world, contract, target, case, dtype, options, explained,
                                      lambda exc: _crash(exc).message)
                message += f"; {why}" if why else ""
            failed = run.remaining if run.target is None or run.target[0] == "crash" else [run.target[1]]
            if not isinstance(exc, AssertionError):  # e.g. Hypothesis' Flaky: the failure did not replay
                message = f"{message} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            if run.other is not None:  # never hidden: a different failure met while shrinking this one
                message += f" (while shrinking, another failure on {run.other[0]!r}: {run.other[1]})"
            took_down = list(failed) if len(failed) > 1 else []  # one crash, every property it failed named
            for p in failed:
                verdicts[p] = PropertyVerdict(
                    p, contract.statement(p, dtype, options), specs[p].regime, dtype, ws, backend, FAIL,
                    examples=run.calls, max_error=None if outcome is None else outcome.max_error,
                    bound=None if outcome is None else outcome.bound, counterexample=repr(case), failure=message,
                    ranks=list(ranks), reproduce=replay, examples_until_failure=run.first_failure,
                    seconds=time.perf_counter() - started, took_down=took_down)
            remaining = [p for p in remaining if p not in failed]
            continue
        for p in run.remaining:
            s = run.stats[p]
            verdicts[p] = PropertyVerdict(p, contract.statement(p, dtype, options), specs[p].regime, dtype, ws,
                                          backend, PASS, examples=s.examples, max_error=s.max_error, bound=s.bound,
                                          seconds=time.perf_counter() - started, note=s.note)
        remaining = []
    for p, m in met.items():  # a failure met is never hidden by a later pass (or skip after a hang)
        if verdicts[p].verdict != FAIL:
            verdicts[p] = _met_verdict(world, contract, target, dtype, options, replay, explained, verdicts[p], m)
    return [verdicts[p] for p in specs]


def _met_verdict(world: World, contract: Contract, target: Any, dtype: str, options: dict, replay: str,
                 explained: dict[str, str], own: PropertyVerdict, met: _Met) -> PropertyVerdict:
    """The FAIL of a property whose failure ``met`` another run met, where its own run (``own``: a pass, or a skip
    after a hang) did not fail it again: that example (not shrunk), its message, ranks, error and bound."""
    failed = met.outcome
    why = explain_failure(world, contract, target, met.case, dtype, options, explained,
                          lambda exc: _crash(exc).message)
    ran = (f"its own run of {own.examples} examples did not fail it again" if own.verdict == PASS
           else f"its own run ended in a skip: {own.failure}")
    message = (f"{failed.message}{f'; {why}' if why else ''} (met {met.during}, at example {met.calls}, and not "
               f"shrunk: {ran})")
    return PropertyVerdict(own.property, own.statement, own.regime, dtype, own.world_size, own.backend, FAIL,
                           examples=met.calls, max_error=failed.max_error, bound=failed.bound,
                           counterexample=repr(met.case), failure=message, ranks=list(failed.ranks),
                           reproduce=replay, examples_until_failure=met.calls, seconds=own.seconds)


def default_seed(profile: str) -> int:
    """The seed of a run given none: 0 under a derandomized profile (``ci``), whose search is the same
    whatever the seed (as ``distcheck check`` records it), else 32 random bits, recorded so the run replays.
    Raises ConfigError for an unknown profile."""
    from distcheck.engine.profiles import get_profile

    return 0 if get_profile(profile).derandomize else random.getrandbits(32)


def certify(target: Any, contract: str | Contract, *, pool: World | None = None, world: World | None = None,
            world_sizes: Sequence[int] | None = None,
            backend: str = "gloo", examples: int | None = None, seed: int | None = None, profile: str = "ci",
            dtypes: Sequence[str] | str | None = None, options: dict | None = None, timeout_s: float = 60.0,
            launcher: str = "local", batch: int = 1, companions: dict[int, World] | None = None) -> Certification:
    """Certify ``target`` under ``contract`` on real worlds; return the :class:`Certification`.

    Args:
        target: ``"module:object"`` or the object itself (a module class, a torch parallel style,
            a plan dict, a factory ``make(ctx, case)``; see the contract).
        contract: a contract name (``"row-parallel-linear"``) or instance.
        pool / world: a started or unstarted world to use (``RankPool``, ``TorchrunWorld``, any object
            with ``run``/``world_size``/``backend``); else ``world_sizes`` (default ``(2,)``) pools of
            ``backend`` are opened here and closed after.
        examples: Hypothesis examples per property (default: the profile's).
        seed: Hypothesis seed (default: 0 under the derandomized ``ci`` profile, which searches the same way
            whatever the seed; under ``dev`` and ``thorough`` drawn and recorded).
        profile: ``"dev"``, ``"ci"`` (default) or ``"thorough"``.
        dtypes: subset of ``float64``, ``float32``, ``bfloat16`` (default: the contract's).
        options: contract options (see ``distcheck certify --list-contracts``).
        timeout_s: seconds one example may take on a world opened here.
        batch: examples per world step (default 1). Larger batches amortize the round trip to the
            ranks; Hypothesis then draws lists of ``batch`` cases (``examples / batch`` of them), a
            failure reports the failing case, and shrinking replays whole batches.
        companions: worlds by size (borrowed, not closed) for a contract whose examples also run on other
            worlds (:meth:`~distcheck.engine.contracts.contract.Contract.companion_worlds`: a checkpoint loaded
            on fewer or more ranks than saved it); a size not given is opened here, one pool per size, with
            the certified world's backend and timeout, and closed after.

    Returns the Certification: ``.ok``, ``.verdicts``, ``.rows()``, ``.assert_certified()``.

    Raises:
        UnknownQuantityError: an unknown contract or option name (with close matches).
        TargetError / ProtocolError (ConfigErrors): a target that does not import or does not fit.
        BackendUnavailable: a backend that cannot run here (NCCL without enough GPUs).
    """
    from distcheck.engine.profiles import get_profile

    contract = get_contract(contract)
    opts = contract.parse_options(options)
    obj, given_ref = import_target(target) if isinstance(target, str) else (target, reference_of(target))
    spec, opts = contract.resolve(obj, given_ref, opts)
    ref: str = spec.ref
    dts = check_dtypes(dtypes, contract)
    get_profile(profile)
    if examples is not None:
        check_positive_int("examples", examples)
    check_positive_int("batch", batch)
    seed = default_seed(profile) if seed is None else seed
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError("seed", seed, "must be an integer >= 0")
    run_settings = _settings(profile, examples, batch)
    distribution, version = package_version(ref)
    if spec.build.get("distribution"):  # a target that names the library it wraps (distcheck.libs.targets)
        distribution, version = spec.build["distribution"], distribution_version(spec.build["distribution"])
    worlds = worlds_for(contract, pool, world, world_sizes, backend, timeout_s)
    started = time.perf_counter()
    given_options = {k: v for k, v in opts.items() if v != next(o.default for o in contract.options if o.name == k)}
    cert = Certification(target=ref, contract=contract.name, backend=backend, world_sizes=[], dtypes=list(dts),
                         options=given_options, seed=seed, profile=profile, max_examples=examples, launcher=launcher,
                         distribution=distribution, version=version, batch=batch, code=code_identity(obj, ref))
    others = companions_for(contract, opts, worlds, backend, timeout_s, companions)
    try:
        _certify_worlds(cert, worlds, others, contract, spec, ref, dts, opts, given_options, profile, seed,
                        examples, launcher, batch, run_settings)
    finally:
        if others is not None:
            others.close()
    cert.seconds = time.perf_counter() - started
    return cert


def _certify_worlds(cert: Certification, worlds: list, others: Companions | None, contract: Contract, spec: Any,
                    ref: str, dts: Sequence[str], opts: dict, given_options: dict, profile: str, seed: int,
                    examples: int | None, launcher: str, batch: int, run_settings: settings) -> None:
    """Every world of ``certify`` in turn, its verdicts added to ``cert`` (after a hang, the rest skipped)."""
    hung: PropertyVerdict | None = None  # the step that timed out: the rest of the target is skipped
    for i, w in enumerate(worlds):
        if others is not None:  # the companions no world left needs are closed
            others.close(keep=[n for later in worlds[i:] for n in contract.companion_worlds(later.world_size, opts)])
        clock = hangs.StepClock()  # the world's slowest finished step: the timeout of a hang's shrinking follows it
        degenerate = contract.cannot_fail(w.world_size, opts) or contract.beyond_profile(w.world_size, profile)
        if hung is not None or degenerate is not None:  # not started: nothing there could fail, or it would hang
            cert.world_sizes.append(w.world_size)
            for dt in dts:
                cert.verdicts += (hangs.skipped_after_hang(contract, dt, opts, w.world_size, cert.backend, hung)
                                  if hung is not None else
                                  _skips(contract, dt, opts, w.world_size, cert.backend, str(degenerate)))
            continue
        with w as opened:
            live = opened if others is None else Joined(opened, others)
            cert.world_sizes.append(live.world_size)
            cert.backend = live.backend
            for dt in dts:
                if hung is not None:
                    cert.verdicts += hangs.skipped_after_hang(contract, dt, opts, live.world_size, live.backend, hung)
                    continue
                replay = reproduce_command(ref, contract.name, world_size=live.world_size, backend=live.backend,
                                           seed=seed, profile=profile, examples=examples, dtype=dt,
                                           options=given_options, launcher=launcher,
                                           importable=spec.pickled is None, batch=batch)
                cert.verdicts += _certify_dtype(live, contract, spec, dt, opts, run_settings, seed, replay, batch,
                                                cert.compositions, clock)
                hung = next((v for v in cert.verdicts if v.hung), None)
