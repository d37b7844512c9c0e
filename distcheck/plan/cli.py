"""``distcheck plan``: size a run (memory), draw a schedule (pipeline) or a mesh (layout).

:func:`add_plan_parser` adds the ``plan`` command to the main parser and
:func:`run_plan` runs it; :func:`add_report_options` gives ``check`` and
``audit`` their ``--report DIR`` and ``--quiet`` options. Importing this
module imports neither sympy, torch nor matplotlib: the work is imported when
a command runs.

Exit codes of ``plan``: 0 a layout fits (``memory``), or the schedule and its
closed forms agree (``pipeline``); 1 nothing fits, the given layout does not
fit, or a figure disagrees with its closed form; 2 bad input, including a
model that cannot fit the GPUs in any layout.
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path

from distcheck.core.vocab import Schedule, names

__all__ = ["add_plan_parser", "add_report_options", "run_plan"]

EXIT_OK, EXIT_FAIL = 0, 1
_SIM_SCHEDULES = names(Schedule)
#: the schedules ``plan memory`` sizes (distcheck.plan.estimate.SCHEDULES, not imported here: it loads numpy)
_PLANNED_SCHEDULES = (Schedule.ONE_F_ONE_B.value, Schedule.GPIPE.value)
#: torch.distributed.pipelining schedule classes distcheck can build tables of
#: (the keys of distcheck.runners.pipelining.SCHEDULES; a test keeps them equal)
TORCH_SCHEDULES = ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
                   "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
_TORCH_FOR = {Schedule.GPIPE: "ScheduleGPipe", Schedule.ONE_F_ONE_B: "Schedule1F1B",
              Schedule.INTERLEAVED: "ScheduleInterleaved1F1B"}
_SIM_FOR = {v: k for k, v in _TORCH_FOR.items()}
_CONVENTIONS = ("mixed_adamw", "mixed_adamw_fp32_grads", "adam_8bit", "sgd_momentum", "moments_only")


def add_report_options(parser: argparse.ArgumentParser, *, quiet: bool = True) -> None:
    """``--report DIR`` (an HTML and a Markdown report) and, unless ``quiet=False``, ``--quiet`` (no progress bar)."""
    parser.add_argument("--report", type=Path, default=None, metavar="DIR",
                        help="also write DIR/report.html (self-contained) and DIR/report.md with the tables and figures")
    if quiet:
        parser.add_argument("--quiet", action="store_true", help="no progress bar or progress lines on stderr")


def _figure_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--figure", type=Path, default=None, metavar="PATH.png|PATH.svg",
                        help=f"write {what} to this file (PNG or SVG; needs matplotlib: pip install 'distcheck[plot]')")


def add_plan_parser(sub) -> argparse.ArgumentParser:
    """Add ``plan`` (with ``memory``, ``pipeline`` and ``layout``) to the subparsers ``sub``."""
    plan = sub.add_parser(
        "plan", help="plan a run: which layout fits, its bubble and communication; schedule and mesh figures",
        description="Plan a training run under named conventions: `plan memory` sizes every parallel layout of a "
                    "model on a set of GPUs and recommends one, `plan pipeline` simulates a pipeline schedule, "
                    "`plan layout` shows the rank groups of a mesh.",
        epilog="Exit codes: 0 a layout fits / the figures agree, 1 nothing fits / a figure disagrees, 2 bad input.",
    )
    what = plan.add_subparsers(dest="plan_command", metavar="WHAT", parser_class=type(plan))

    mem = what.add_parser(
        "memory", help="memory per GPU, bubble and communication of every layout; the lesson's order of questions",
        description="Size a model on GPUs. With a layout (--tp/--pp/--dp/--cp/--zero) give its per-GPU breakdown "
                    "and fit; without, enumerate every valid (tp, pp, dp, cp, ZeRO stage), rank them and walk the "
                    "order: DDP, ZeRO-1/2, ZeRO-3, TP inside a node and PP across nodes, then context parallelism.",
        epilog="Exit codes: 0 a layout fits, 1 nothing fits (or the given layout does not), 2 bad input "
               "(including a model no layout can hold). GB = 1e9 bytes, GiB = 2**30 bytes.",
    )
    m = mem.add_argument_group("model (one of: a preset, a shape, a parameter count)")
    m.add_argument("--model", default=None, metavar="NAME",
                   help="a preset: lesson-7b-style, lesson-70b-style, llama-2-7b, llama-3-8b, llama-3-70b, "
                        "llama-3-405b, llama-3.2-1b (case and dashes ignored: llama3-70b works)")
    m.add_argument("--params", default=None, metavar="N", help="a raw parameter count (13e9): state only, no activations")
    for flag in ("hidden-size", "num-layers", "ffn-hidden-size", "num-heads", "num-kv-heads", "vocab-size"):
        m.add_argument(f"--{flag}", type=int, default=None, metavar="N", help=f"explicit shape: {flag.replace('-', ' ')}")
    h = mem.add_argument_group("hardware")
    h.add_argument("--gpus", type=int, required=True, metavar="N", help="GPUs in the run")
    h.add_argument("--gpus-per-node", type=int, default=8, metavar="N",
                   help="GPUs per node (default 8); TP stays inside one")
    h.add_argument("--gpu-memory", default="80 GB", metavar="SIZE",
                   help="memory of one GPU: '80GB', '80 GiB' (default 80 GB)")
    h.add_argument("--reserve", default="0 GB", metavar="SIZE",
                   help="memory kept back per GPU for the CUDA context, buffers, fragmentation (default 0 GB)")
    w = mem.add_argument_group("workload")
    w.add_argument("--seq-len", type=int, default=2048, metavar="S", help="tokens per sequence (default 2048)")
    w.add_argument("--micro-batch", type=int, default=1, metavar="B", help="sequences per micro-batch (default 1)")
    w.add_argument("--num-microbatches", "--m", dest="num_microbatches", type=int, default=8, metavar="M",
                   help="micro-batches per step (pipeline micro-batches or accumulation steps; default 8)")
    w.add_argument("--recompute", choices=("none", "selective", "full"), default="selective",
                   help="activation recomputation (Korthikanti et al. 2022; default selective)")
    w.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=True,
                   help="split the remaining activations by tp too (default on)")
    w.add_argument("--bytes-per-param", choices=_CONVENTIONS, default="mixed_adamw",
                   help="bytes-per-parameter convention (default mixed_adamw: 16 B/param)")
    w.add_argument("--schedule", choices=_PLANNED_SCHEDULES, default=Schedule.ONE_F_ONE_B.value,
                   help="pipeline schedule (default 1f1b)")
    lay = mem.add_argument_group("layout (give any of these to size one layout; the rest default to 1, ZeRO 0)")
    for axis in ("tp", "pp", "dp", "cp"):
        lay.add_argument(f"--{axis}", type=int, default=None, metavar="N",
                         help=f"{axis} degree" + (" (default: gpus / (tp*pp*cp))" if axis == "dp" else ""))
    lay.add_argument("--zero", type=int, default=None, metavar="STAGE", help="ZeRO stage 0..3")
    out = mem.add_argument_group("output")
    out.add_argument("--top", type=int, default=15, metavar="N", help="layouts shown in the table (default 15)")
    out.add_argument("--all", action="store_true", help="show every layout")
    out.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    _figure_option(out, "the memory chart (stacked bars per GPU)")
    add_report_options(out)

    pipe = what.add_parser(
        "pipeline", help="simulate a pipeline schedule: timeline, step ticks, bubble, peak in flight",
        description="Run a schedule tick by tick (forward t_f, backward t_b ticks per stage; communication free) "
                    "and compare its step time, bubble and activation stash with the closed forms. --torch replays "
                    "torch.distributed.pipelining's own schedule table (imports torch).",
        epilog="Exit codes: 0 the simulation agrees with the closed forms (and torch's table with the simulator, "
               "or a recorded torch finding), 1 a disagreement, 2 bad input.",
    )
    pipe.add_argument("--p", type=int, required=True, metavar="P", help="pipeline stages (ranks)")
    pipe.add_argument("--m", type=int, required=True, metavar="M", help="micro-batches")
    pipe.add_argument("--schedule", choices=_SIM_SCHEDULES, default=Schedule.ONE_F_ONE_B.value, help="schedule (default 1f1b)")
    pipe.add_argument("--v", type=int, default=None, metavar="V", help="chunks per rank (interleaved; default 2)")
    pipe.add_argument("--t-f", type=int, default=1, metavar="TICKS", help="ticks of one forward (default 1)")
    pipe.add_argument("--t-b", type=int, default=2, metavar="TICKS", help="ticks of one backward (default 2)")
    pipe.add_argument("--torch", nargs="?", const="auto", default=None, choices=("auto",) + TORCH_SCHEDULES,
                      metavar="CLASS", help="also replay torch's table: the class matching --schedule, or one of "
                                            + ", ".join(TORCH_SCHEDULES))
    pipe.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    _figure_option(pipe, "the Gantt chart")
    add_report_options(pipe)

    mesh = what.add_parser(
        "layout", help="the rank groups of a tp × cp × pp × dp mesh and where the nodes split them",
        description="List the rank groups of each axis (order tp, cp, pp, dp innermost first, as Llama 3 and "
                    "torch's DeviceMesh lay them out) and whether each group stays inside a node.",
    )
    for axis in ("tp", "pp", "dp", "cp"):
        mesh.add_argument(f"--{axis}", type=int, default=1, metavar="N", help=f"{axis} degree (default 1)")
    mesh.add_argument("--gpus-per-node", type=int, default=8, metavar="N", help="GPUs per node (default 8)")
    mesh.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    _figure_option(mesh, "the layout diagram (up to 64 ranks)")
    add_report_options(mesh)
    return plan


def run_plan(args) -> int:
    """Run ``distcheck plan WHAT``; returns the exit code (errors propagate as ConfigError)."""
    if args.plan_command == "memory":
        return _run_memory(args)
    if args.plan_command == "pipeline":
        return _run_pipeline(args)
    if args.plan_command == "layout":
        return _run_layout(args)
    from distcheck.core.errors import ConfigError

    raise ConfigError("plan", None, "needs what to plan: memory, pipeline or layout (see 'distcheck plan --help')")


# ----------------------------------------------------------------------------------------------- helpers


def _console():
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=200)


def _exact(x):
    """JSON for an exact number: an int as is, a Fraction as {"exact": "p/q", "approx": float}."""
    if x is None or isinstance(x, (int, str)):
        return x
    q = Fraction(x)
    return int(q) if q.denominator == 1 else {"exact": f"{q.numerator}/{q.denominator}", "approx": float(q)}


def _frac(q) -> str:
    q = Fraction(q)
    return str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}"


def _gbv(x) -> str:
    """Bytes as a GB number without the unit (table cells)."""
    return "-" if x is None else f"{float(Fraction(x)) / 1e9:,.2f}"


def _check_outputs(args) -> None:
    """Refuse a bad --figure or --report before any work."""
    from distcheck.core.errors import ConfigError

    if getattr(args, "figure", None) is not None:
        fig = args.figure
        if fig.suffix.lower() not in (".png", ".svg"):
            raise ConfigError("--figure", str(fig), "must end in .png or .svg")
        if not fig.parent.is_dir():
            raise ConfigError("--figure", str(fig), f"folder {fig.parent} does not exist")
    if getattr(args, "report", None) is not None:
        from distcheck.reportdoc import check_report_dir

        check_report_dir(args.report)
    if getattr(args, "figure", None) is not None or getattr(args, "report", None) is not None:
        from distcheck.viz import require_matplotlib

        require_matplotlib()


# ----------------------------------------------------------------------------------------------- memory


def _memory_inputs(args):
    from distcheck.plan import Hardware, Workload, resolve_model

    model = resolve_model(args.model, params=args.params, hidden_size=args.hidden_size, num_layers=args.num_layers,
                          ffn_hidden_size=args.ffn_hidden_size, num_heads=args.num_heads,
                          num_kv_heads=args.num_kv_heads, vocab_size=args.vocab_size)
    hardware = Hardware(gpus=args.gpus, gpu_memory=args.gpu_memory, gpus_per_node=args.gpus_per_node,
                        reserve=args.reserve)
    workload = Workload(seq_len=args.seq_len, micro_batch_size=args.micro_batch,
                        num_microbatches=args.num_microbatches, recompute=args.recompute,
                        sequence_parallel=args.sequence_parallel, bytes_per_param=args.bytes_per_param,
                        schedule=args.schedule)
    return model, hardware, workload


def _explicit_layout(args, model, hardware, workload):
    from distcheck.core.errors import ConfigError
    from distcheck.core.validate import check_positive_int
    from distcheck.plan import Layout
    from distcheck.plan.estimate import check_model_rules

    given = {a: getattr(args, a) for a in ("tp", "pp", "dp", "cp", "zero")}
    if all(v is None for v in given.values()):
        return None
    degrees = {a: (1 if given[a] is None else given[a]) for a in ("tp", "pp", "cp")}
    for a, v in degrees.items():
        check_positive_int(a, v)
    check_model_rules(model, workload, degrees["tp"], degrees["pp"], degrees["cp"])
    if given["dp"] is None:
        inner = degrees["tp"] * degrees["pp"] * degrees["cp"]
        if hardware.gpus % inner:
            raise ConfigError("gpus", hardware.gpus, f"must be divisible by tp*cp*pp = {degrees['tp']}*{degrees['cp']}*"
                                                     f"{degrees['pp']} = {inner} (dp = gpus / (tp*cp*pp))")
        given["dp"] = hardware.gpus // inner
    return Layout(tp=degrees["tp"], pp=degrees["pp"], dp=given["dp"], cp=degrees["cp"],
                  zero=0 if given["zero"] is None else given["zero"])


def _header(model, hardware, workload) -> str:
    from distcheck.plan.planner import gb

    nodes = f"{hardware.nodes} node{'s' if hardware.nodes > 1 else ''} of {hardware.gpus_per_node}"
    reserve = f", {gb(hardware.reserve)} reserved" if hardware.reserve else ""
    return (f"{model.name} ({model.params:,} parameters) on {hardware.gpus} GPUs ({nodes}) of "
            f"{gb(hardware.gpu_memory)}{reserve}; seq_len {workload.seq_len}, micro-batch {workload.micro_batch_size}, "
            f"{workload.num_microbatches} micro-batches per step, {workload.schedule}")


def _lesson_lines(p) -> list[str]:
    from distcheck.plan.planner import gb

    cap = gb(p.hardware.usable_bytes)
    ddp = "fits" if p.ddp_state <= p.hardware.usable_bytes else "does not fit"
    lines = [f"Before activations: DDP keeps the whole state on every GPU, {gb(p.ddp_state)} per GPU: {ddp} {cap}."]
    if p.smallest_split is None:
        lines.append("No TP × PP split (ZeRO-0) fits before activations on these GPUs.")
    else:
        tp, pp, state = p.smallest_split
        lines.append(f"The smallest TP × PP split that fits before activations (ZeRO-0): TP {tp} × PP {pp}, "
                     f"{gb(state)} per GPU.")
    return lines


def _estimate_row(i, e) -> list[str]:
    lay = e.layout
    comm = _gbv(e.comm_total) + ("" if e.comm_complete else "+")
    return [str(i), str(lay.tp), str(lay.cp), str(lay.pp), str(lay.dp), str(lay.zero), _gbv(e.state),
            _gbv(e.activations), _gbv(e.total), f"{float(e.memory_fraction):.0%}", "yes" if e.fits else "no",
            f"{float(e.bubble_fraction):.1%}", comm, str(lay.lesson_step)]


_COLUMNS = ("#", "tp", "cp", "pp", "dp", "ZeRO", "state GB", "activations GB", "total GB", "of GPU", "fits",
            "bubble", "comm GB/step", "question")


def _layouts_table(estimates, title: str):
    from distcheck.reportdoc import Table

    return Table(title, _COLUMNS, tuple(tuple(_estimate_row(i, e)) for i, e in enumerate(estimates, 1)),
                 note="state = weights + gradients + optimizer state; comm = bytes each GPU sends per step "
                      "(tp + pp + cp + dp); question = the lesson's question the layout answers (1 DDP, 2 ZeRO-1/2, "
                      "3 ZeRO-3, 4 TP and PP, 5 context parallel); '+' marks a total without the parts that need the "
                      "model's shape")


def _estimate_json(e) -> dict:
    return {
        "layout": e.layout.as_dict(), "label": e.layout.label, "question": e.layout.lesson_step,
        "params_per_gpu": _exact(e.params_per_gpu),
        "bytes": {k: _exact(v) for k, v in
                  (("weights", e.weights), ("gradients", e.gradients), ("optimizer", e.optimizer),
                   ("activations", e.activations), ("state", e.state), ("total", e.total))},
        "activations_per_layer": _exact(e.activations_per_layer), "layers_per_stage": e.layers_per_stage,
        "in_flight": e.in_flight, "fits": e.fits, "fits_before_activations": e.fits_before_activations,
        "bubble_fraction": _exact(e.bubble_fraction),
        "comm_bytes_per_step": {k: _exact(v) for k, v in e.comm.items()}, "comm_total": _exact(e.comm_total),
    }


def _inputs_json(model, hardware, workload) -> dict:
    return {
        "model": {"name": model.name, "params": model.params},
        "hardware": {"gpus": hardware.gpus, "gpus_per_node": hardware.gpus_per_node,
                     "gpu_memory_bytes": _exact(hardware.gpu_memory), "reserve_bytes": _exact(hardware.reserve)},
        "workload": {"seq_len": workload.seq_len, "micro_batch_size": workload.micro_batch_size,
                     "num_microbatches": workload.num_microbatches, "recompute": workload.recompute,
                     "sequence_parallel": workload.sequence_parallel, "bytes_per_param": workload.bytes_per_param,
                     "schedule": workload.schedule},
    }


def _memory_figures(model, hardware, workload, chosen, fmt_caption: str):
    """The memory chart and, for up to 64 ranks, the chosen layout's diagram, as (Figure, caption, name)."""
    from distcheck import layout as layout_ref
    from distcheck import viz
    from distcheck.plan.charts import memory_chart_data

    chart = memory_chart_data(model, hardware, workload, chosen)
    figs = [(viz.memory_bars(**chart.viz_args()), f"Memory per GPU: ZeRO stages 0-3 under DP and for {fmt_caption}, "
                                                  "with the GPU's capacity line", "memory")]
    if hardware.gpus <= viz.MAX_DIAGRAM_RANKS:
        cfg = layout_ref.ParallelConfig(tp=chosen.tp, pp=chosen.pp, dp=chosen.dp, cp=chosen.cp,
                                        gpus_per_node=hardware.gpus_per_node)
        figs.append((viz.layout_diagram(cfg), f"Rank groups of {chosen.label}", "layout"))
    return figs


def _write_outputs(args, figs, title, notes, tables, results=None, summary=None) -> None:
    from distcheck import viz
    from distcheck.reportdoc import figure_image, write_report

    if args.figure is not None and figs:
        viz.save_figure(figs[0][0], args.figure)
    if args.report is not None:
        images = [figure_image(f, caption, name) for f, caption, name in figs]
        write_report(args.report, title, results=results, tables=tables, figures=images, notes=notes, summary=summary)


def _run_memory(args) -> int:
    from distcheck.core.errors import ConfigError
    from distcheck.plan import conventions, estimate, plan
    from distcheck.plan.planner import gb
    from distcheck.progress import Progress

    _check_outputs(args)
    if args.top < 1:
        raise ConfigError("--top", args.top, "must be >= 1")
    model, hardware, workload = _memory_inputs(args)
    chosen = _explicit_layout(args, model, hardware, workload)
    console = _console()
    header = _header(model, hardware, workload)
    if chosen is not None:
        e = estimate(model, hardware, workload, chosen)
        return _report_one(args, console, model, hardware, workload, e, header, conventions(model, workload))
    with Progress("sizing layouts", quiet=args.quiet) as bar:
        result = plan(model, hardware, workload, on_progress=lambda done, total: bar.update(completed=done, total=total))
    lesson = _lesson_lines(result)
    rec = result.recommended
    verdict = (f"Recommendation: {rec.layout.label} (question {rec.layout.lesson_step}), {gb(rec.total)} per GPU"
               if rec else f"Nothing fits {gb(hardware.usable_bytes)} with activations under these settings "
                           "(try --recompute full, a smaller --micro-batch or more GPUs)")
    if args.format == "json":
        data = _inputs_json(model, hardware, workload)
        data.update({
            "conventions": list(result.conventions), "ddp_state_bytes": _exact(result.ddp_state),
            "smallest_tp_pp_before_activations": (None if result.smallest_split is None else
                                                  {"tp": result.smallest_split[0], "pp": result.smallest_split[1],
                                                   "state_bytes": _exact(result.smallest_split[2])}),
            "questions": [{"step": q.step, "question": q.question, "answer": q.answer, "reason": q.reason,
                           "best": None if q.best is None else q.best.layout.as_dict()} for q in result.questions],
            "recommended": None if rec is None else _estimate_json(rec),
            "layouts": [_estimate_json(e) for e in result.estimates],
        })
        print(json.dumps(data, indent=2))
    else:
        _print_plan(console, result, header, lesson, verdict, args)
    shown = rec.layout if rec is not None else result.estimates[0].layout
    if args.figure is not None or args.report is not None:
        figs = _memory_figures(model, hardware, workload, shown, shown.label)
        from distcheck.reportdoc import Table

        questions = Table("The lesson's order of questions", ("question", "asked", "answer", "figures"),
                          tuple((str(q.step), q.question, "yes" if q.answer else "no", q.reason)
                                for q in result.questions))
        _write_outputs(args, figs, f"distcheck plan memory: {model.name} on {hardware.gpus} GPUs",
                       [header, verdict, *lesson, *result.reasons(), *(f"Convention: {c}" for c in result.conventions)],
                       [questions, _layouts_table(result.estimates, "Every valid layout, ranked")])
    return EXIT_OK if rec is not None else EXIT_FAIL


def _print_plan(console, result, header, lesson, verdict, args) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]distcheck plan memory[/]: {escape(header)}", highlight=False)
    for c in result.conventions:
        console.print(f"  [dim]{escape(c)}[/]", highlight=False)
    console.print()
    for line in lesson:
        console.print(escape(line), highlight=False)
    console.print()
    for line in result.reasons():
        console.print(escape(line), highlight=False)
    console.print(f"[bold]{escape(verdict)}[/]", highlight=False)
    shown = result.estimates if args.all else result.estimates[: args.top]
    table = Table(title=f"layouts, ranked ({len(shown)} of {len(result.estimates)})")
    for col in _COLUMNS:
        table.add_column(col, justify="left" if col in ("fits",) else "right", no_wrap=True)
    for i, e in enumerate(shown, 1):
        row = _estimate_row(i, e)
        row[10] = "[green]yes[/]" if e.fits else "[red]no[/]"
        table.add_row(*row)
    console.print(table)
    if len(shown) < len(result.estimates):
        console.print(f"[dim]{len(result.estimates) - len(shown)} more: --all, or --format json[/]", highlight=False)


def _report_one(args, console, model, hardware, workload, e, header, convs) -> int:
    from rich.markup import escape
    from rich.table import Table as RichTable

    from distcheck.plan.planner import gb
    from distcheck.reportdoc import Table

    cap = gb(hardware.usable_bytes)
    conv = workload.convention
    per_param = {"weights": conv.weights, "gradients": conv.grads, "optimizer": conv.optimizer}
    sharded_from = {"weights": 3, "gradients": 2, "optimizer": 1}
    rows: list[tuple[str, ...]] = []
    for comp in ("weights", "gradients", "optimizer"):
        shard = f" / {e.layout.shard_ranks} (ZeRO-{e.layout.zero})" if e.layout.zero >= sharded_from[comp] else ""
        rows.append((comp, f"{per_param[comp]} B/param × {float(Fraction(e.params_per_gpu)):,.0f} params{shard}",
                     gb(getattr(e, comp))))
    if e.activations is None:
        rows.append(("activations", "not counted (no model shape)", "-"))
    else:
        rows.append(("activations", f"{gb(e.activations_per_layer)} per layer × {e.layers_per_stage} layers × "
                                    f"{e.in_flight} in flight", gb(e.activations)))
    rows.append(("total", f"{float(e.memory_fraction):.1%} of {gb(hardware.gpu_memory)}", gb(e.total)))
    verdict = (f"{e.layout.label}: {gb(e.total)} per GPU {'fits' if e.fits else 'does NOT fit'} {cap} "
               f"({'fits' if e.fits_before_activations else 'does not fit'} before activations); bubble "
               f"{_frac(e.bubble_fraction)} = {float(e.bubble_fraction):.1%}; sends "
               + (f"{gb(e.comm_total)}" if e.comm_complete else f"at least {gb(e.comm_total)} (tp, pp and cp need the "
                                                                "model's shape)") + " per GPU per step")
    comm_rows = tuple((axis, gb(v) if v is not None else "needs the model shape") for axis, v in e.comm.items())
    if args.format == "json":
        data = _inputs_json(model, hardware, workload)
        data.update({"conventions": convs, "estimate": _estimate_json(e)})
        print(json.dumps(data, indent=2))
    else:
        console.print(f"[bold]distcheck plan memory[/]: {escape(header)}", highlight=False)
        for c in convs:
            console.print(f"  [dim]{escape(c)}[/]", highlight=False)
        t = RichTable(title=f"{e.layout.label}: memory per GPU")
        for col in ("part", "how", "bytes"):
            t.add_column(col, justify="right" if col == "bytes" else "left")
        for r in rows:
            t.add_row(*(escape(x) for x in r))
        console.print(t)
        ct = RichTable(title="bytes each GPU sends per step")
        ct.add_column("axis")
        ct.add_column("bytes", justify="right")
        for r in comm_rows:
            ct.add_row(*r)
        console.print(ct)
        style = "green" if e.fits else "bold red"
        console.print(f"[{style}]{escape(verdict)}[/]", highlight=False)
    if args.figure is not None or args.report is not None:
        figs = _memory_figures(model, hardware, workload, e.layout, e.layout.label)
        tables = [Table(f"{e.layout.label}: memory per GPU", ("part", "how", "bytes"), tuple(rows)),
                  Table("Bytes each GPU sends per step", ("axis", "bytes"), comm_rows)]
        _write_outputs(args, figs, f"distcheck plan memory: {model.name}, {e.layout.label}",
                       [header, verdict, *(f"Convention: {c}" for c in convs)], tables)
    return EXIT_OK if e.fits else EXIT_FAIL


# ----------------------------------------------------------------------------------------------- pipeline


def _timeline_facts(t) -> list[tuple[str, str]]:
    return [
        ("step", f"{t.step_ticks} ticks"),
        ("busy per rank", ", ".join(map(str, t.busy_ticks)) + " ticks"),
        ("idle per rank", ", ".join(map(str, t.idle_ticks)) + f" ticks ({sum(t.idle_ticks)} idle cells)"),
        ("bubble fraction (idle / total)", f"{_frac(t.bubble_fraction)} = {float(t.bubble_fraction):.2%}"),
        ("bubble ratio (idle / ideal)", f"{_frac(t.bubble_ratio)} = {float(t.bubble_ratio):.2%}"),
        ("peak in flight per rank", ", ".join(map(str, t.peak_in_flight))),
    ]


def _closed_form_rows(t, schedule: str, p: int, m: int, v: int, t_f: int, t_b: int):
    """CheckResult rows: the simulator's figures against the catalogue's closed forms."""
    from distcheck.closed_form import get
    from distcheck.report import FAIL, PASS, CheckResult

    inputs = dict(p=p, m=m, t_f=t_f, t_b=t_b) | ({"v": v} if schedule == Schedule.INTERLEAVED else {})
    got = {"step_ticks": t.step_ticks, "bubble_fraction": t.bubble_fraction, "bubble_ratio": t.bubble_ratio,
           "peak_in_flight": max(t.peak_in_flight), "idle_ticks": max(t.idle_ticks)}
    rows = []
    for quantity, value in got.items():
        name = f"pipeline.{quantity}.{schedule}"
        form = get(name)
        want = form.evaluate(**{k: x for k, x in inputs.items() if k in {i.name for i in form.inputs}})
        ok = Fraction(want) == Fraction(value)
        rows.append(CheckResult(check=name, backend="simulator", verdict=PASS if ok else FAIL, examples=1,
                                detail=f"simulator {_frac(value)} {'=' if ok else '!='} closed form {_frac(want)}"))
    return rows


def _run_pipeline(args) -> int:
    from distcheck import pipeline
    from distcheck.report import exit_code

    _check_outputs(args)
    v = args.v if args.v is not None else (2 if args.schedule == Schedule.INTERLEAVED else 1)
    t = pipeline.simulate(args.schedule, args.p, args.m, v=v, t_f=args.t_f, t_b=args.t_b)
    rows = _closed_form_rows(t, args.schedule, args.p, args.m, v, args.t_f, args.t_b)
    torch_part = None
    if args.torch is not None:
        torch_part = _torch_part(args, v)
    name = args.schedule + (f" (v = {v})" if args.schedule == Schedule.INTERLEAVED else "")
    if torch_part is not None:
        rows.append(torch_part["row"])
    if args.format == "json":
        data = {"schedule": args.schedule, "p": args.p, "m": args.m, "v": v, "t_f": args.t_f, "t_b": args.t_b,
                "simulator": _timeline_json(t), "checks": [_row_json(r) for r in rows]}
        if torch_part is not None:
            data["torch"] = {"schedule": torch_part["schedule"], "table": torch_part["raw"],
                             "timeline": None if torch_part["timeline"] is None else _timeline_json(torch_part["timeline"])}
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
            tables.append(Table(f"torch's {torch_part['schedule']} table", ("figure", "value"), tuple(_timeline_facts(tt))))
        if len(figs) > 1:
            figs = [figs[1], figs[0]]  # with --torch, --figure draws torch's table; the report shows both
        from distcheck.report import summary_line

        _write_outputs(args, figs, f"distcheck plan pipeline: {name}, p = {args.p}, m = {args.m}",
                       [f"forward {args.t_f} tick(s), backward {args.t_b} tick(s) per stage; communication free"],
                       tables, results=rows, summary=summary_line(rows))
    return exit_code(rows)


def _torch_part(args, v: int) -> dict:
    """Replay torch's schedule table; a CheckResult row compares it with the simulator."""
    from distcheck import pipeline
    from distcheck.core.errors import ConfigError
    from distcheck.progress import Progress
    from distcheck.report import FAIL, PASS, SKIP, CheckResult

    schedule = _TORCH_FOR[args.schedule] if args.torch == "auto" else args.torch
    if args.t_f != 1 or args.t_b != 2:
        raise ConfigError("--torch", schedule, "replays torch's table at t_f = 1, t_b = 2 only (the lesson's ticks)")
    with Progress("importing torch", quiet=args.quiet):
        try:
            from distcheck.runners.findings import label_findings
            from distcheck.runners.pipelining import SCHEDULES, check_table, torch_table
        except ImportError as exc:
            raise ConfigError("--torch", schedule, f"needs torch: {exc}") from None
    torch_v = SCHEDULES[schedule][1]
    sim_name = SCHEDULES[schedule][0]
    if sim_name == args.schedule and v != torch_v:
        raise ConfigError("--v", v, f"must be {torch_v} with --torch: distcheck builds {schedule}'s table with {torch_v} "
                                    "stages per rank")
    ok, detail = check_table(schedule, args.p, args.m)
    if ok is None and detail.startswith("torch refuses"):
        raise ConfigError("--m", args.m, f"is refused by torch's {schedule}: {detail}")
    timeline = None
    table = torch_table(schedule, args.p, args.m)
    raw = [" ".join(str(a) for a in row if a is not None) for row in table]
    try:
        timeline = pipeline.replay(pipeline.from_torch_actions(table), torch_v * args.p, args.m, t_f=1, t_b=2)
    except (ConfigError, pipeline.DeadlockError) as exc:
        detail = f"{detail} ({str(exc).splitlines()[0]})" if str(exc) not in detail else detail
    if sim_name is not None and sim_name != args.schedule:
        detail += f" (compared with the simulator's {sim_name})"
    verdict = SKIP if ok is None else PASS if ok else FAIL
    row = CheckResult(check=f"pp.table.{schedule}", backend="torch-table", verdict=verdict, examples=1, detail=detail)
    row = label_findings([row])[0]
    return {"schedule": schedule, "timeline": timeline, "row": row, "v": torch_v, "raw": raw}


def _timeline_json(t) -> dict:
    return {"num_ranks": t.num_ranks, "num_stages": t.num_stages, "num_microbatches": t.num_microbatches,
            "step_ticks": t.step_ticks, "busy_ticks": list(t.busy_ticks), "idle_ticks": list(t.idle_ticks),
            "bubble_fraction": _exact(t.bubble_fraction), "bubble_ratio": _exact(t.bubble_ratio),
            "peak_in_flight": list(t.peak_in_flight), "render": t.render().splitlines()}


def _row_json(r) -> dict:
    return {"check": r.check, "backend": r.backend, "verdict": r.verdict, "detail": r.detail}


_MAX_PRINTED_TICKS = 160


def _print_pipeline(t, name, rows, torch_part, args) -> None:
    from rich.markup import escape

    from distcheck.report import FAIL, FINDING, PASS

    console = _console()
    console.print(f"[bold]distcheck plan pipeline[/]: {escape(name)}, p = {args.p}, m = {args.m}; forward "
                  f"{args.t_f}, backward {args.t_b} tick(s) per stage, communication free", highlight=False)

    def show(tl, title):
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
            for r, line in enumerate(torch_part["raw"]):
                console.print(f"rank {r} | {line}", highlight=False, markup=False, soft_wrap=True)
    console.print()
    style = {PASS: "green", FAIL: "bold red", FINDING: "magenta"}
    for r in rows:
        console.print(f"[{style.get(r.verdict, 'yellow')}]{r.verdict:<7}[/] {escape(r.check)}: {escape(r.detail)}",
                      highlight=False)


# ----------------------------------------------------------------------------------------------- layout


#: the largest world whose groups ``plan layout`` lists (from the first four of each axis beyond 64 ranks)
_MAX_LISTED_WORLD = 2**16


def _fmt_group(group: list[int]) -> str:
    """``[0,1,2,3]``, or ``[0,128,256,…,16256] (128 ranks)`` for a group of more than 8 ranks."""
    if len(group) <= 8:
        return "[" + ",".join(map(str, group)) + "]"
    return "[" + ",".join(map(str, group[:3])) + f",…,{group[-1]}] ({len(group)} ranks)"


def _run_layout(args) -> int:
    from rich.markup import escape

    from distcheck import layout as layout_ref
    from distcheck.reportdoc import Table

    _check_outputs(args)
    cfg = layout_ref.ParallelConfig(tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, gpus_per_node=args.gpus_per_node)
    axes = [a for a in ("tp", "cp", "pp", "dp") if cfg.degree(a) > 1] or ["tp"]
    listed = cfg.world_size <= 64
    info = []
    for a in axes:
        local = layout_ref.groups_node_local(cfg, a)
        groups = layout_ref.groups(cfg, a) if cfg.world_size <= _MAX_LISTED_WORLD else None
        info.append({"axis": a, "degree": cfg.degree(a), "num_groups": cfg.num_groups(a), "node_local": local,
                     "groups": groups if listed else (groups[:4] if groups else None)})
    head = (f"{' × '.join(f'{a} {cfg.degree(a)}' for a in cfg.order if cfg.degree(a) > 1) or '1 rank'} = "
            f"{cfg.world_size} ranks on {-(-cfg.world_size // cfg.gpus_per_node)} node(s) of {cfg.gpus_per_node}, "
            f"order {'-'.join(cfg.order)} (innermost first)")
    if args.format == "json":
        print(json.dumps({"world_size": cfg.world_size, "gpus_per_node": cfg.gpus_per_node, "order": list(cfg.order),
                          "mesh_shape": list(layout_ref.mesh_shape(cfg)),
                          "mesh_dim_names": list(layout_ref.mesh_dim_names(cfg)), "axes": info}, indent=2))
    else:
        console = _console()
        console.print(f"[bold]distcheck plan layout[/]: {escape(head)}", highlight=False)
        console.print(f"  torch: init_device_mesh(device, {layout_ref.mesh_shape(cfg)}, "
                      f"mesh_dim_names={layout_ref.mesh_dim_names(cfg)})", highlight=False, markup=False)
        for d in info:
            where = "each inside a node" if d["node_local"] else "crossing nodes"
            console.print(f"{d['axis']}: {d['num_groups']} groups of {d['degree']}, {where}", highlight=False)
            if d["groups"] is not None:
                more = "" if listed else f" ... ({d['num_groups'] - len(d['groups'])} more)"
                console.print("  " + " ".join(_fmt_group(g) for g in d["groups"]) + more, highlight=False, markup=False)
    if args.figure is not None or args.report is not None:
        from distcheck import viz

        figs = [(viz.layout_diagram(cfg), f"Rank groups: {head}", "layout")]
        table = Table("Rank groups", ("axis", "degree", "groups", "inside a node", "ranks"),
                      tuple((d["axis"], str(d["degree"]), str(d["num_groups"]), "yes" if d["node_local"] else "no",
                             " ".join(_fmt_group(g) for g in (d["groups"] or []))) for d in info))
        _write_outputs(args, figs, f"distcheck plan layout: {head}", [head], [table])
    return EXIT_OK
