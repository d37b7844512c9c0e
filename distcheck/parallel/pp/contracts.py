"""Pipeline-schedule contracts: an action table, or a torch schedule run on a world, against the simulator.

Two contracts, on the simulator of :mod:`distcheck.parallel.pp` (the lesson's costs: F = 1,
B = 2 = I + W, an overlapped pair 3; communication free):

* ``pipeline-table`` (no process group). Target: a function ``table(p, m)`` returning a
  per-rank action table (``{rank: [action, ...]}`` or a list of lists; distcheck
  :class:`~distcheck.parallel.pp.Action` objects, ``(Action, Action)`` overlapped pairs, torch
  ``_Action`` objects or ``None``), or a ``torch.distributed.pipelining`` schedule class
  (``PipelineScheduleSingle`` or ``PipelineScheduleMulti``; its table is built without a
  process group, as torch's schedule visualizer builds it). Cases: p in 1..``max_stages``
  and every m the compared schedule allows.
* ``pipeline-schedule`` (a world: p = world size). Target: a torch schedule class. Every
  rank builds its stages of a real model (Linear + ReLU, weights integers / 8, float64), runs
  one ``step`` and reports its table and its gradients.

Properties (all exact): ``dependencies`` (the table replays: every (stage, micro-batch) has
its F and its B, or I and W, each dependency is met, W after its I, no deadlock, every stage
on the rank the schedule's placement gives it); ``order`` (the table is the simulator's
schedule action for action); ``bubble`` (its step ticks and bubble fraction are the
simulator's); ``stash`` (its peak of activations in flight per rank is the simulator's); and,
for ``pipeline-schedule``, ``gradients`` (every stage's gradients are bitwise equal to the
unsplit model's on the whole batch: integer inputs, weights integers / 8 and a sum-of-squares
loss with ``scale_grads=False`` keep every sum exact in float64).

Options: ``schedule`` (the simulator's schedule to compare with; torch's own classes know
theirs), ``v`` (stages per rank; 0: the schedule's own), ``max_stages`` (``pipeline-table``).

Self-contained on purpose: it uses only the contract base (:mod:`distcheck.engine.contracts.contract`)
and the pp package, so moving the base is a change of one import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.core.vocab import Schedule, names
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, make_target, resolve
from distcheck.engine.world import RankContext

__all__ = ["PipelineTable", "PipelineSchedule"]

_SCHEDULES = names(Schedule)
#: the largest ``max_stages`` of ``pipeline-table``: every p in 1..max_stages and every m up to 4p + 4 is
#: enumerated before drawing, and one case simulates p * m * v actions; 32 stages keeps both to milliseconds
MAX_STAGES = 32
#: the largest ``v`` (stages per rank) either contract takes
MAX_V = 16
_COMMON = (
    PropertySpec("dependencies", "the table replays: every action once, every dependency met (W after its I), "
                                 "no deadlock, every stage on its rank", "exact"),
    PropertySpec("order", "the table is the simulator's schedule, action for action", "exact"),
    PropertySpec("bubble", "step ticks and bubble fraction equal the simulator's", "exact"),
    PropertySpec("stash", "peak activations in flight on every rank equal the simulator's", "exact"),
)
_OPTIONS = (
    Option("schedule", "", str, "the simulator's schedule to compare with (torch's own classes know theirs)",
           choices=("",) + _SCHEDULES),
    Option("v", 0, int, "stages per rank (0: the schedule's own)", min_value=0, max_value=MAX_V),
)


def _torch_schedule_class(obj: object) -> bool:
    if not isinstance(obj, type):
        return False
    try:
        from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
    except ImportError:
        return False
    return issubclass(obj, (PipelineScheduleSingle, PipelineScheduleMulti))


def _schedule_options(obj: object, ref: str | None, options: dict) -> dict:
    """``schedule`` and ``v`` made explicit (torch's own classes map to theirs)."""
    from distcheck.parallel.pp.schedules import FIXED_V
    from distcheck.parallel.pp.tables import TORCH_SCHEDULES

    out = dict(options)
    known = TORCH_SCHEDULES.get(getattr(obj, "__name__", "")) if _torch_schedule_class(obj) else None
    if not out["schedule"]:
        if known is None:
            raise ProtocolError("target", ref or repr(obj), "needs --option schedule=NAME: the simulator's schedule to "
                                                            f"compare it with (one of {', '.join(_SCHEDULES)})")
        out["schedule"] = known[0]
    if not out["v"]:
        out["v"] = known[1] if known is not None and known[0] == out["schedule"] else FIXED_V.get(out["schedule"], 2)
    return out


def _valid_m(schedule: str, p: int, v: int) -> list[int]:
    from distcheck.parallel.pp.schedules import check_shape

    out = []
    for m in range(1, 4 * p + 5):
        try:
            check_shape(schedule, p, m, v)
        except ConfigError:
            continue
        out.append(m)
    return out


def _plain(table: Sequence[Sequence[Any]]) -> list[list]:
    """A table as plain data: per rank, ``(kind, microbatch, stage)`` or a list of two of them."""
    from distcheck.parallel.pp.actions import Action
    from distcheck.parallel.pp.reference import from_torch_actions

    items = table.items() if isinstance(table, dict) else enumerate(table)
    out: dict[int, list] = {}
    for rank, row in items:
        units: list = []
        for a in row:
            if a is None:
                continue
            if isinstance(a, Action):
                units.append((a.kind, a.microbatch, a.stage))
            elif isinstance(a, tuple) and all(isinstance(x, Action) for x in a):
                units.append([(x.kind, x.microbatch, x.stage) for x in a])
            else:
                for u in from_torch_actions({rank: [a]}, pairs=True)[rank]:
                    units.append([(x.kind, x.microbatch, x.stage) for x in u] if isinstance(u, tuple)
                                 else (u.kind, u.microbatch, u.stage))
        out[int(rank)] = units
    return [out.get(r, []) for r in range(max(out) + 1)] if out else []


def _actions(rows: list) -> dict[int, list]:
    from distcheck.parallel.pp.actions import Action

    return {r: [tuple(Action(*x) for x in u) if isinstance(u, list) else Action(*u) for u in row]
            for r, row in enumerate(rows)}


def _outcomes(rows: list, schedule: str, p: int, m: int, v: int) -> dict[str, Outcome]:
    from distcheck.parallel.pp.tables import compare_with_simulator

    try:
        order = _actions(rows)
        found = compare_with_simulator(order, schedule, p, m, v)
    except ConfigError as exc:  # an action the table cannot hold (a negative index ...)
        return {s.name: Outcome(False, message=f"p={p}, m={m}: not a valid action table: {exc}") for s in _COMMON}
    return {name: Outcome(ok, 0.0 if ok else None, 0.0, "" if ok else detail) for name, (ok, detail) in found.items()}


class PipelineTable(Contract):
    """A per-rank action table against the simulator's schedule (module docstring)."""

    name = "pipeline-table"
    min_world_size = 1
    min_world_reason = ("runs in this process: p is drawn in 1..max_stages, whatever the world; max_stages = 1 "
                        "is degenerate (see cannot_fail)")
    parallelism = "pp"
    summary = "an action table (a function (p, m) -> table, or a torch schedule class) against the simulator"
    properties = _COMMON
    options = _OPTIONS + (Option("max_stages", 4, int, "the largest p drawn", min_value=1, max_value=MAX_STAGES),)
    dtypes = ("float64",)
    needs_world = False

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        options = _schedule_options(obj, ref, options)
        if _torch_schedule_class(obj):
            return make_target(obj, ref, "torch-class"), options
        if callable(obj) and not isinstance(obj, type):
            return make_target(obj, ref, "table"), options
        raise ProtocolError("target", ref or repr(obj), "must be a function table(p, m) -> {rank: [action, ...]} or a "
                                                        "torch.distributed.pipelining schedule class")

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[tuple[int, int]] | None:
        shapes = [(p, m) for p in range(1, max(1, options["max_stages"]) + 1)
                  for m in _valid_m(options["schedule"], p, options["v"])]
        return st.sampled_from(shapes) if shapes else None

    def skip_reason(self, world_size: int, dtype: str, options: dict) -> str:
        return f"{options['schedule']} allows no (p, m) with p <= {options['max_stages']}"

    def cannot_fail(self, world_size: int, options: dict) -> str | None:
        if options["max_stages"] < 2:  # every table drawn has p = 1: one stage, nothing crosses a rank
            return (f"max_stages = {options['max_stages']} is degenerate: every table drawn has one "
                    "stage (p = 1), so no activation crosses a rank; give max_stages >= 2")
        return super().cannot_fail(world_size, options)

    def run_rank(self, ctx: RankContext, target: Target, case: tuple[int, int], dtype: str,
                 options: dict) -> list[list]:
        p, m = case
        obj = resolve(target)
        if target.kind == "torch-class":
            from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

            table = get_schedule_ops(obj, p, m, num_stages_per_rank=options["v"])
        else:
            table = obj(p, m)
        if not isinstance(table, (dict, list, tuple)):
            raise ProtocolError("target", target.ref, f"returned {type(table).__name__}, not a per-rank table")
        return _plain(table)

    def check(self, case: tuple[int, int], results: list, world_size: int, dtype: str, options: dict) -> dict[str,
              Outcome]:
        p, m = case
        return _outcomes(results[0], options["schedule"], p, m, options["v"])


class PipelineSchedule(Contract):
    """A torch schedule class run on a world against the simulator and the unsplit model (module docstring)."""

    name = "pipeline-schedule"
    min_world_size = 2
    min_world_reason = ("p = world size = 1 is one stage: no activation or gradient crosses a rank, so the claims "
                        "on the order across stages, the bubble and the gradients passed between stages cannot "
                        "fail there")
    parallelism = "pp"
    summary = "a torch pipelining schedule class, one step on a world: its table vs the simulator, its gradients"
    properties = _COMMON + (PropertySpec("gradients", "every stage's gradients equal the unsplit model's on the whole "
                                                      "batch", "bitwise"),)
    options = _OPTIONS
    dtypes = ("float64",)

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        if not _torch_schedule_class(obj):
            raise ProtocolError("target", ref or repr(obj), "must be a torch.distributed.pipelining schedule class "
                                                            "(PipelineScheduleSingle or PipelineScheduleMulti)")
        return make_target(obj, ref, "torch-class"), _schedule_options(obj, ref, options)

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[dict] | None:
        ms = _valid_m(options["schedule"], world_size, options["v"])
        if not ms:
            return None
        return st.builds(lambda m, d, rows, seed: {"m": m, "d": d, "rows_per_mb": rows, "seed": seed},
                         st.sampled_from(ms), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**16))

    def skip_reason(self, world_size: int, dtype: str, options: dict) -> str:
        return f"{options['schedule']} allows no m at p = {world_size}"

    def run_rank(self, ctx: RankContext, target: Target, case: dict, dtype: str, options: dict) -> dict:
        from distcheck.parallel.pp.checks import schedule_step

        return schedule_step(ctx, resolve(target), options["schedule"], options["v"], case)

    def check(self, case: dict, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        rows = [[tuple(a) if not isinstance(a, list) else a for a in r["table"]] for r in results]
        plain = [[[(k, mb, s) for k, s, mb in u] if isinstance(u, list) else (u[0], u[2], u[1]) for u in row]
                 for row in rows]  # the rank function's (kind, stage, mb) as (kind, mb, stage)
        out = _outcomes(plain, options["schedule"], world_size, case["m"], options["v"])
        bad = [r for r, res in enumerate(results) if not res["bitwise"]]
        worst = max(res["max_error"] for res in results)
        out["gradients"] = Outcome(not bad, worst, 0.0, "" if not bad else
                                   f"m={case['m']}: gradients of ranks {bad} differ from the unsplit model's: max "
                                   f"error {worst:.3e}, bitwise expected", tuple(bad))
        return out
