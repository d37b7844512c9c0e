"""Rank-layout contracts: a framework's rank groups against distcheck's layout, and its bad-input handling.

``rank-layout``. The target is a :class:`LayoutTarget`: for a configuration drawn by
Hypothesis it gives the rank groups of each of its axes (or of several axes at once:
``tp-pp``, ``dp-cp``), keyed by its own names, and distcheck's layout for the same order
(:mod:`distcheck.parallel.layout`: :class:`~distcheck.parallel.layout.ParallelConfig` for the single tp, cp,
pp, dp axes and ep carved from dp*cp; :class:`~distcheck.parallel.layout.AxisLayout`,
:func:`~distcheck.parallel.layout.megatron_layout` and :func:`~distcheck.parallel.layout.torchtitan_layout`
for foreign axes, split dp, borrowed ep and multi-axis groups). One property, ``groups``:
the groups are equal as sets of sets (each group sorted, the groups sorted by first rank: a
process group numbers its ranks in ascending order, whatever order they are listed in).
A failure names the smallest configuration Hypothesis found and the first axis whose
groups differ, both listed.

``bad-input``. The target is a :class:`ProbeSet`: calls with valid input (the positive
control) and calls with bad input (zero or negative sizes, a repeated or unknown axis, a
product that is not the world size), each a Python expression over the library's API. One
property, ``refused``, judged in a fresh interpreter, plain and under ``python -O`` (which
removes ``assert`` statements):

1. every valid call is accepted. If one raises, the row FAILs saying the target rejects
   valid input (a changed signature, a renamed module: a ``TypeError`` on every probe would
   otherwise read as "refuses bad input"), and no bad input is judged;
2. every bad call raises an exception of one of the target's refusal kinds
   (:data:`REFUSALS` by default, subclasses included: ``ValueError`` and its subclasses such
   as distcheck's ConfigError, ``AssertionError`` of a plain ``assert``, ``LookupError`` of an
   unknown name, ``RuntimeError``; a library may name its documented error type instead).
   Any other exception (``TypeError`` of a wrong call, ``NameError``, ``AttributeError``) is
   not a refusal: it is listed as such and the row FAILs.

A failure lists what each mode accepts (with what it returned), and under ``-O`` only what
``-O`` newly lets through, then what raised an exception that is not a refusal. Probes are
data, run by ``python -c`` with a timeout; nothing here imports the library.

Neither contract needs a process group (``needs_world = False``); the "dtype" is ``exact``
(ranks are integers). Adapters for Megatron-core's ``RankGenerator`` and torchtitan's
``ParallelDims`` are in :mod:`distcheck.libs.targets` (``distcheck certify
distcheck.libs.targets.megatron:RANK_GENERATOR --contract rank-layout``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_callable, check_type
from distcheck.engine.contracts.contract import EXACT, Contract, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, make_target, require_distribution, resolve
from distcheck.engine.world import RankContext

__all__ = ["LayoutTarget", "Probe", "ProbeSet", "canonical", "run_probes", "RankLayoutContract",
           "BadInputContract", "PROBE_TIMEOUT_S", "REFUSALS"]

Groups = Mapping[str, list[list[int]]]

#: seconds one interpreter may take to import the target and run every probe
PROBE_TIMEOUT_S = 180.0

#: the exception kinds that count as refusing a bad input unless a ProbeSet names its own (each
#: an expression evaluated after the setup lines; subclasses count): a value rejected
#: (``ValueError``), a plain ``assert`` (``AssertionError``, which ``python -O`` then removes),
#: an unknown name looked up (``LookupError``: ``KeyError``, ``IndexError``) and ``RuntimeError``
#: (Megatron-core's documented raise). ``TypeError`` is not among them: on these probes it means
#: the call no longer matches the library's signature.
REFUSALS = ("ValueError", "AssertionError", "LookupError", "RuntimeError")


def canonical(groups: Iterable[Iterable[int]]) -> list[list[int]]:
    """Groups as sorted lists of ints, sorted by first rank (the order ranks are numbered in)."""
    return sorted(sorted(int(r) for r in g) for g in groups)


@dataclass(frozen=True)
class LayoutTarget:
    """A target of the rank-layout contract.

    Attributes:
        name: its name in reports, e.g. ``"megatron.rank_generator"``.
        distribution: the PyPI distribution it comes from (None for code of the current checkout).
        configs: ``() -> strategy`` of configurations (dicts) to draw.
        groups: ``config -> {axis token: groups}``: what the target builds.
        reference: ``config -> {axis token: groups}``: what distcheck's layout says, for at least
            every token the target gives.
        order: ``config -> order string`` shown in a counterexample (innermost first).

    Raises ConfigError for a name that is not a str or a field that is not callable.
    """

    name: str
    distribution: str | None
    configs: Callable[[], Any]
    groups: Callable[[dict], Groups]
    reference: Callable[[dict], Groups]
    order: Callable[[dict], str]

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a name such as 'megatron.rank_generator'")
        for f in ("configs", "groups", "reference", "order"):
            check_callable(f, getattr(self, f))


@dataclass(frozen=True)
class Probe:
    """One call with bad input: ``label`` (e.g. ``"tp=0"``) and the expression that makes it."""

    label: str
    expr: str


@dataclass(frozen=True)
class ProbeSet:
    """A target of the bad-input contract.

    Attributes:
        name: its name in reports.
        distribution: the PyPI distribution it comes from (None for code of the current checkout).
        setup: the import lines the probes need.
        probes: the calls with bad input, each of which must be refused.
        valid: the positive control: calls with valid input, each of which must be accepted
            (at least one; the same API as the probes, so a changed signature shows here).
        refusals: the exception kinds that count as a refusal, each an expression evaluated
            after ``setup`` (a builtin name, or the library's documented error type such as
            ``"mylib.ConfigError"``); subclasses count. Default :data:`REFUSALS`.

    Raises ConfigError for a setup that is not a str, probes or valid calls that are not a
    non-empty tuple of Probes, labels repeated across them, or refusals that are not a
    non-empty tuple of str."""

    name: str
    distribution: str | None
    setup: str
    probes: tuple[Probe, ...]
    valid: tuple[Probe, ...]
    refusals: tuple[str, ...] = REFUSALS

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a name such as 'megatron.rank_generator'")
        check_type("setup", self.setup, str, "must be Python import lines")
        for f in ("probes", "valid"):
            calls = getattr(self, f)
            check_type(f, calls, tuple, "must be a tuple of Probes")
            if not calls:
                raise ConfigError(f, calls, "must hold at least one Probe")
            for p in calls:
                check_type(f, p, Probe, "must hold Probes only")
        labels = [p.label for p in (*self.valid, *self.probes)]
        if len(set(labels)) != len(labels):
            raise ConfigError("probes", labels, "labels must be unique across valid and probes")
        check_type("refusals", self.refusals, tuple, "must be a tuple of exception type expressions")
        if not self.refusals or not all(isinstance(r, str) for r in self.refusals):
            raise ConfigError("refusals", self.refusals, "must be a non-empty tuple of str such as 'ValueError'")


def _first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"group {i}: {x} vs {y}"
    return f"{len(a)} groups vs {len(b)}"


def _target(obj: Any, ref: str | None, kind: type, what: str) -> Target:
    if not isinstance(obj, kind):
        raise ProtocolError("target", ref or repr(obj), f"must be a distcheck.parallel.layout.contracts."
                                                        f"{kind.__name__} ({what}; see docs/CERTIFY.md)")
    named: Any = obj  # an Estimator, EstimatorFamily, LayoutTarget or ProbeSet: each has a name and a distribution
    require_distribution(ref or named.name, named.distribution)
    return make_target(obj, ref or f"{kind.__name__}({named.name!r})", kind.__name__, distribution=named.distribution)


class RankLayoutContract(Contract):
    """A framework's rank groups equal distcheck's layout for the same order (module docstring)."""

    name = "rank-layout"
    min_world_size = 1
    min_world_reason = ("runs in this process: the target draws its own layouts (their axes several ranks wide), "
                        "whatever the world")
    parallelism = "layout"
    summary = "a framework's rank groups of every axis equal distcheck's layout for the same order"
    properties = (PropertySpec("groups", "the target's rank groups of every axis it gives equal distcheck's layout "
                                         "for the same order, as sets of sets", "exact"),)
    dtypes = (EXACT,)
    needs_world = False

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        return _target(obj, ref, LayoutTarget, "the rank groups of each axis for a configuration"), options

    def cases(self, world_size: int, dtype: str, options: dict) -> None:  # the target's: see cases_for
        return None

    def cases_for(self, target: Any, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[dict]:
        return resolve(target).configs()

    def run_rank(self, ctx: RankContext, target: Any, case: dict, dtype: str, options: dict) -> dict:
        # the target's groups, and distcheck's for the same configuration (no process group: one process)
        layout: LayoutTarget = resolve(target)
        got = {token: canonical(g) for token, g in layout.groups(case).items()}
        want = {token: canonical(g) for token, g in layout.reference(case).items()}
        return {"got": got, "want": want, "order": layout.order(case)}

    def check(self, case: dict, results: list, world_size: int, dtype: str,
              options: dict) -> dict[str, Outcome]:
        got, want, order = results[0]["got"], results[0]["want"], results[0]["order"]
        for token, theirs in got.items():
            if token not in want:
                return {"groups": Outcome(False, message=f"{case} (order {order}): distcheck has no layout for "
                                                         f"{token!r}")}
            mine = want[token]
            if mine != theirs:
                return {"groups": Outcome(False, message=(
                    f"{case} (order {order}): {token} groups differ, target {theirs} vs distcheck {mine} "
                    f"(first difference: {_first_difference(theirs, mine)})"))}
        return {"groups": Outcome(True, note=f"the groups of {', '.join(sorted(got))} equal distcheck's layout for "
                                              "the same order")}


_RUNNER = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import logging
logging.disable(logging.CRITICAL)
setup, probes, refusals = json.loads(sys.argv[1])
env = {}
exec(setup, env)
kinds = tuple(eval(r, env) for r in refusals)
out = {}
for label, expr in probes:
    try:
        value = eval(expr, env)
        out[label] = ["accepted", repr(value)[:200]]
    except BaseException as exc:
        if isinstance(exc, kinds):
            out[label] = ["refused", type(exc).__name__]
        else:
            out[label] = ["raised", (type(exc).__name__ + ": " + str(exc))[:200]]
print("PROBES " + json.dumps(out))
"""


def run_probes(setup: str, probes: tuple[Probe, ...], *, optimize: bool,
               timeout_s: float = PROBE_TIMEOUT_S,
               refusals: tuple[str, ...] = REFUSALS) -> dict[str, tuple[str, str]]:
    """``{label: ("accepted", repr) | ("refused", exception type) | ("raised", "Type: message")}``
    from a fresh interpreter (``python -O`` when ``optimize``): "refused" when the exception is
    an instance of one of ``refusals`` (expressions evaluated after ``setup``), "raised" for any
    other exception. Raises ConfigError when the interpreter fails (a setup or refusal kind
    that does not evaluate) or times out."""
    check_type("setup", setup, str, "must be Python import lines")
    payload = json.dumps([setup, [[p.label, p.expr] for p in probes], list(refusals)])
    cmd = [sys.executable, *(["-O"] if optimize else []), "-c", _RUNNER, payload]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConfigError("timeout_s", timeout_s, "was not enough to import the target and run its probes") from None
    for line in done.stdout.splitlines():
        if line.startswith("PROBES "):
            return {k: (v[0], v[1]) for k, v in json.loads(line[7:]).items()}
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise ConfigError("setup", setup, f"failed in a fresh interpreter (exit {done.returncode}): {tail}")


class BadInputContract(Contract):
    """Valid input is accepted and every bad input is refused with a refusal kind, plainly and
    under ``python -O`` (module docstring)."""

    name = "bad-input"
    min_world_size = 1
    min_world_reason = "runs in this process: the probes are fixed calls, refused or not whatever the world"
    parallelism = "layout"
    summary = ("valid input is accepted and every call with bad input raises a refusal, in a fresh interpreter, "
               "plain and under python -O")
    properties = (PropertySpec("refused", "valid calls are accepted (the positive control) and every probe with bad "
                                          "input raises one of the refusal kinds, plain and under python -O (no check "
                                          "is an assert)", "exact"),)
    dtypes = (EXACT,)
    needs_world = False

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        return _target(obj, ref, ProbeSet, "calls with valid and with bad input"), options

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[str]:
        return st.just("every probe")  # one example: the probes are fixed data

    def run_rank(self, ctx: RankContext, target: Any, case: str, dtype: str, options: dict) -> dict:
        probes: ProbeSet = resolve(target)
        calls = (*probes.valid, *probes.probes)
        return {"valid": [p.label for p in probes.valid], "labels": [p.label for p in probes.probes],
                "refusals": list(probes.refusals),
                **{mode: run_probes(probes.setup, calls, optimize=mode == "python -O", refusals=probes.refusals)
                   for mode in ("python", "python -O")}}

    def check(self, case: str, results: list, world_size: int, dtype: str,
              options: dict) -> dict[str, Outcome]:
        r = results[0]
        valid, labels, plain, optimized = r["valid"], r["labels"], r["python"], r["python -O"]
        rejected = [f"{mode}: {v} raised {out[v][1]}" for mode, out in (("python", plain), ("python -O", optimized))
                    for v in valid if out[v][0] != "accepted"]
        if rejected:
            return {"refused": Outcome(False, message=(
                "the target rejects valid input (" + "; ".join(rejected) + "): a changed signature or API? "
                "no bad input is judged"))}
        parts = []
        accepted = [f"{p} -> {plain[p][1]}" for p in labels if plain[p][0] == "accepted"]
        if accepted:
            parts.append("python accepts " + "; ".join(accepted))
        newly = [f"{p} -> {optimized[p][1]}" for p in labels
                 if optimized[p][0] == "accepted" and plain[p][0] != "accepted"]
        if newly:  # name only what -O newly lets through
            parts.append("python -O accepts " + "; ".join(newly))
        for mode, out in (("python", plain), ("python -O", optimized)):
            other = [f"{p} -> {out[p][1]}" for p in labels if out[p][0] == "raised"]
            if other:
                parts.append(f"{mode} raises what is not a refusal ({', '.join(r['refusals'])}): "
                             + "; ".join(other))
        refusals = ", ".join(f"{p}: {plain[p][1]}" for p in labels if plain[p][0] == "refused")
        return {"refused": Outcome(not parts, message=" | ".join(parts),
                                   note=f"valid input is accepted; every bad input is refused, also under python -O "
                                        f"({refusals})")}
