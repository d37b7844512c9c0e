"""``distcheck plan pp``: a schedule's timeline, its closed forms, and torch's own table."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from distcheck.core.vocab import Schedule
from distcheck.plan.cli_output import _check_outputs, _console, _exact, _frac, _write_outputs

if TYPE_CHECKING:
    from distcheck.core.results import CheckResult
    from distcheck.parallel.pp.timeline import Timeline

#: the torch.distributed.pipelining class of each simulated schedule (``--torch auto``)
_TORCH_FOR = {Schedule.GPIPE: "ScheduleGPipe", Schedule.ONE_F_ONE_B: "Schedule1F1B",
              Schedule.INTERLEAVED: "ScheduleInterleaved1F1B", Schedule.LOOPED_BFS: "ScheduleLoopedBFS",
              Schedule.INTERLEAVED_ZB: "ScheduleInterleavedZeroBubble", Schedule.ZB_V: "ScheduleZBVZeroBubble",
              Schedule.DUALPIPEV: "ScheduleDualPipeV"}
#: the schedules whose forms take (p, m, v, t_f, t_b) like GPipe's
_FULL_BACKWARD = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.LOOPED_BFS)

def _timeline_facts(t: Timeline) -> list[tuple[str, str]]:
    return [
        ("step", f"{t.step_ticks} ticks"),
        ("busy per rank", ", ".join(map(str, t.busy_ticks)) + " ticks"),
        ("idle per rank", ", ".join(map(str, t.idle_ticks)) + f" ticks ({sum(t.idle_ticks)} idle cells)"),
        ("bubble fraction (idle / total)", f"{_frac(t.bubble_fraction)} = {float(t.bubble_fraction):.2%}"),
        ("bubble ratio (idle / ideal)", f"{_frac(t.bubble_ratio)} = {float(t.bubble_ratio):.2%}"),
        ("peak in flight per rank", ", ".join(map(str, t.peak_in_flight))),
    ]


def _closed_form_rows(t: Timeline, schedule: str, p: int, m: int, v: int, t_f: int, t_b: int) -> list[CheckResult]:
    """CheckResult rows: the simulator's figures against the catalogue's closed forms (for a split
    schedule, its bubble and stash forms where their regime holds; ``skip`` rows name it otherwise)."""
    from distcheck.closed_form import get
    from distcheck.parallel.pp.forms_zero_bubble import regime
    from distcheck.report import FAIL, PASS, SKIP, CheckResult

    inputs = dict(p=p, m=m, v=v, t_f=t_f, t_b=t_b)
    if schedule in _FULL_BACKWARD:
        got = {"step_ticks": t.step_ticks, "bubble_fraction": t.bubble_fraction, "bubble_ratio": t.bubble_ratio,
               "peak_in_flight": max(t.peak_in_flight), "idle_ticks": max(t.idle_ticks)}
        why = None
    else:
        inputs |= dict(t_i=t_b // 2, t_w=t_b // 2, t=t_f, t_fb=t_f + t_b)
        got = {"bubble_ticks": max(t.idle_ticks), "peak_in_flight": max(t.peak_in_flight)}
        why = regime(schedule, p=p, m=m, t_f=t_f, t_i=t_b // 2, t_w=t_b // 2, t_fb=t_f + t_b)
    rows = []
    for quantity, value in got.items():
        name = f"pp.{quantity}.{schedule}"
        if why:
            rows.append(CheckResult(check=name, backend="simulator", verdict=SKIP, examples=0,
                                    detail=f"outside the form's regime: {why}"))
            continue
        form = get(name)
        want = form.evaluate(**{k: x for k, x in inputs.items() if k in {i.name for i in form.inputs}})
        ok = Fraction(want) == Fraction(value)
        rows.append(CheckResult(check=name, backend="simulator", verdict=PASS if ok else FAIL, examples=1,
                                detail=f"simulator {_frac(value)} {'=' if ok else '!='} closed form {_frac(want)}"))
    return rows


def run_pipeline(args: argparse.Namespace) -> int:
    from distcheck.core.results import exit_code
    from distcheck.parallel import pp as pipeline

    _check_outputs(args)
    from distcheck.parallel.pp.schedules import FIXED_V

    v = args.v if args.v is not None else FIXED_V.get(args.schedule, 2)
    t = pipeline.simulate(args.schedule, args.p, args.m, v=v, t_f=args.t_f, t_b=args.t_b)
    rows = _closed_form_rows(t, args.schedule, args.p, args.m, v, args.t_f, args.t_b)
    torch_part = None
    if args.torch is not None:
        torch_part = _torch_part(args, v)
    name = args.schedule + (f" (v = {v})" if args.schedule not in FIXED_V else "")
    if torch_part is not None:
        rows.append(torch_part["row"])
    if args.format == "json":
        data = {"schedule": args.schedule, "p": args.p, "m": args.m, "v": v, "t_f": args.t_f, "t_b": args.t_b,
                "simulator": _timeline_json(t), "checks": [_row_json(r) for r in rows]}
        if torch_part is not None:
            data["torch"] = {"schedule": torch_part["schedule"], "table": torch_part["raw"],
                             "timeline": (None if torch_part["timeline"] is None
                                          else _timeline_json(torch_part["timeline"]))}
        print(json.dumps(data, indent=2))
    else:
        _print_pipeline(t, name, rows, torch_part, args)
    if args.figure is not None or args.report is not None:
        from distcheck import viz
        from distcheck.reportdoc import Table

        figs = [(viz.pipeline_gantt(t, name=name), f"{name} schedule, p = {args.p}, m = {args.m} (simulator)", "gantt")]
        tables = [Table(f"{name}: simulator", ("figure", "value"), tuple(_timeline_facts(t)))]
        if torch_part is not None and torch_part["timeline"] is not None:
            tt = torch_part["timeline"]
            figs.append((viz.pipeline_gantt(tt, name=torch_part["schedule"]),
                         f"torch's {torch_part['schedule']} table, replayed", "gantt-torch"))
            tables.append(Table(f"torch's {torch_part['schedule']} table", ("figure", "value"),
                                tuple(_timeline_facts(tt))))
        if len(figs) > 1:
            figs = [figs[1], figs[0]]  # with --torch, --figure draws torch's table; the report shows both
        from distcheck.report import summary_line

        _write_outputs(args, figs, f"distcheck plan pp: {name}, p = {args.p}, m = {args.m}",
                       [f"forward {args.t_f} tick(s), backward {args.t_b} tick(s) per stage; communication free"],
                       tables, results=rows, summary=summary_line(rows))
    return exit_code(rows)


def _torch_part(args: argparse.Namespace, v: int) -> dict:
    """Replay torch's schedule table; a CheckResult row compares it with the simulator."""
    from distcheck.core.errors import ConfigError
    from distcheck.parallel import pp as pipeline
    from distcheck.progress import Progress
    from distcheck.report import FAIL, PASS, SKIP, CheckResult

    schedule = _TORCH_FOR[args.schedule] if args.torch == "auto" else args.torch
    if args.t_f != 1 or args.t_b != 2:
        raise ConfigError("--torch", schedule, "replays torch's table at t_f = 1, t_b = 2 only (the lesson's ticks)")
    with Progress("importing torch", quiet=args.quiet):
        try:
            from distcheck.parallel.pp.tables import TORCH_SCHEDULES, _replay_table, check_table, torch_table
            from distcheck.runners.findings import label_findings
        except ImportError as exc:
            raise ConfigError("--torch", schedule, f"needs torch: {exc}") from None
    torch_v = TORCH_SCHEDULES[schedule][1]
    sim_name = TORCH_SCHEDULES[schedule][0]
    if sim_name == args.schedule and v != torch_v:
        raise ConfigError("--v", v, f"must be {torch_v} with --torch: distcheck builds {schedule}'s table with "
                                    f"{torch_v} stages per rank")
    ok, detail = check_table(schedule, args.p, args.m)
    if ok is None and detail.startswith("torch refuses"):
        raise ConfigError("--m", args.m, f"is refused by torch's {schedule}: {detail}")
    timeline = None
    table = torch_table(schedule, args.p, args.m)
    raw = [" ".join(str(a) for a in row if a is not None) for row in table]
    try:
        timeline = _replay_table(schedule, table, args.p, args.m)[1]
    except (ConfigError, pipeline.DeadlockError) as exc:
        detail = f"{detail} ({str(exc).splitlines()[0]})" if str(exc) not in detail else detail
    if sim_name is not None and sim_name != args.schedule:
        detail += f" (compared with the simulator's {sim_name})"
    verdict = SKIP if ok is None else PASS if ok else FAIL
    row = CheckResult(check=f"pp.table.{schedule}", backend="torch-table", verdict=verdict, examples=1, detail=detail)
    row = label_findings([row])[0]
    return {"schedule": schedule, "timeline": timeline, "row": row, "v": torch_v, "raw": raw}


def _timeline_json(t: Timeline) -> dict:
    return {"num_ranks": t.num_ranks, "num_stages": t.num_stages, "num_microbatches": t.num_microbatches,
            "step_ticks": t.step_ticks, "busy_ticks": list(t.busy_ticks), "idle_ticks": list(t.idle_ticks),
            "bubble_fraction": _exact(t.bubble_fraction), "bubble_ratio": _exact(t.bubble_ratio),
            "peak_in_flight": list(t.peak_in_flight), "render": t.render().splitlines()}


def _row_json(r: CheckResult) -> dict:
    return {"check": r.check, "backend": r.backend, "verdict": r.verdict, "detail": r.detail}


_MAX_PRINTED_TICKS = 160


def _print_pipeline(t: Timeline, name: str, rows: list[CheckResult], torch_part: dict[str, Any] | None,
                    args: argparse.Namespace) -> None:
    from rich.markup import escape

    from distcheck.report import FAIL, FINDING, PASS

    console = _console()
    console.print(f"[bold]distcheck plan pp[/]: {escape(name)}, p = {args.p}, m = {args.m}; forward "
                  f"{args.t_f}, backward {args.t_b} tick(s) per stage, communication free", highlight=False)

    def show(tl: Timeline, title: str) -> None:
        console.print(f"\n[bold]{escape(title)}[/]", highlight=False)
        if tl.step_ticks <= _MAX_PRINTED_TICKS:
            console.print(tl.render(), highlight=False, markup=False, soft_wrap=True)
        else:
            console.print(f"({tl.step_ticks} ticks: too wide to print; use --figure)", highlight=False)
        for k, val in _timeline_facts(tl):
            console.print(f"  {k}: {val}", highlight=False)

    show(t, "simulator")
    if torch_part is not None:
        if torch_part["timeline"] is not None:
            show(torch_part["timeline"], f"torch's {torch_part['schedule']} table, replayed")
        else:
            console.print(f"\n[bold]torch's {torch_part['schedule']} table[/] (does not replay; its actions per rank, "
                          "stage + kind + micro-batch):", highlight=False)
            for rank, line in enumerate(torch_part["raw"]):
                console.print(f"rank {rank} | {line}", highlight=False, markup=False, soft_wrap=True)
    console.print()
    style: dict[str, str] = {PASS: "green", FAIL: "bold red", FINDING: "magenta"}
    for r in rows:
        console.print(f"[{style.get(r.verdict, 'yellow')}]{r.verdict:<7}[/] {escape(r.check)}: {escape(r.detail)}",
                      highlight=False)


