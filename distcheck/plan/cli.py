"""``distcheck plan``: size a run (memory), time it (time), draw a schedule (pipeline) or a mesh (layout).

:func:`add_plan_parser` adds the ``plan`` command to the main parser and
:func:`run_plan` runs it; :func:`add_report_options` gives ``check`` and
``audit`` their ``--report DIR`` and ``--quiet`` options. Importing this
module imports neither sympy, torch nor matplotlib: the work is imported when
a command runs.

Exit codes of ``plan``: 0 a layout fits (``memory``, ``time``), or the schedule and its
closed forms agree (``pipeline``); 1 nothing fits, the given layout does not
fit, or a figure disagrees with its closed form; 2 bad input, including a
model that cannot fit the GPUs in any layout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distcheck.core.vocab import Axis, Schedule, names
from distcheck.plan.planner import SORT_KEYS

__all__ = ["add_plan_parser", "add_report_options", "run_plan"]

_SIM_SCHEDULES = names(Schedule)
#: the old name of ``plan pp``, kept for one release with a note on stderr
_OLD_PP = "pipeline"
#: the schedules ``plan memory`` sizes (distcheck.plan.inputs.SCHEDULES, not imported here: it loads numpy)
_PLANNED_SCHEDULES = (Schedule.ONE_F_ONE_B.value, Schedule.GPIPE.value)
#: torch.distributed.pipelining schedule classes distcheck can build tables of
#: (the keys of distcheck.parallel.pp.tables.TORCH_SCHEDULES; a test keeps them equal)
TORCH_SCHEDULES = ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
                   "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
_CONVENTIONS = ("mixed_adamw", "mixed_adamw_fp32_grads", "adam_8bit", "sgd_momentum", "moments_only")
#: the hardware catalogue's names (the keys of distcheck.plan.hardware.ACCELERATORS, not imported here: it loads
#: numpy; a test keeps them equal)
ACCELERATORS = ("h100-sxm", "h200", "a100-80gb", "b200", "mi300x")


def add_report_options(parser: argparse.ArgumentParser, *, quiet: bool = True) -> None:
    """``--report DIR`` (an HTML and a Markdown report) and, unless ``quiet=False``, ``--quiet`` (no progress bar)."""
    parser.add_argument("--report", type=Path, default=None, metavar="DIR",
                        help="also write DIR/report.html (self-contained) and DIR/report.md with the tables and "
                             "figures (needs matplotlib: pip install 'distcheck[plot]')")
    if quiet:
        parser.add_argument("--quiet", action="store_true", help="no progress bar or progress lines on stderr")


def _figure_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--figure", type=Path, default=None, metavar="PATH.png|PATH.svg",
                        help=f"write {what} to this file (PNG or SVG; needs matplotlib: pip install 'distcheck[plot]')")


def _model_args(parser: argparse.ArgumentParser, *, moe: bool) -> None:
    m = parser.add_argument_group("model (one of: a preset, a shape" + (", a parameter count)" if moe else ")"))
    m.add_argument("--model", default=None, metavar="NAME",
                   help="a preset: lesson-7b-style, lesson-70b-style, llama-2-7b, llama-3-8b, llama-3-70b, "
                        "llama-3-405b, llama-3.2-1b" + ("; MoE: deepseek-v3, mixtral-8x7b" if moe else "")
                        + " (case and dashes ignored: llama3-70b works)")
    m.add_argument("--params", default=None, metavar="N",
                   help="a raw parameter count (13e9): state only, no activations" if moe else argparse.SUPPRESS)
    for flag in ("hidden-size", "num-layers", "ffn-hidden-size", "num-heads", "num-kv-heads", "vocab-size"):
        m.add_argument(f"--{flag}", type=int, default=None, metavar="N",
                       help=f"explicit shape: {flag.replace('-', ' ')}")


def _workload_args(parser: argparse.ArgumentParser, m_help: str) -> argparse._ArgumentGroup:
    w = parser.add_argument_group("workload")
    w.add_argument("--seq-len", type=int, default=2048, metavar="S", help="tokens per sequence (default 2048)")
    w.add_argument("--micro-batch", type=int, default=1, metavar="B", help="sequences per micro-batch (default 1)")
    w.add_argument("--num-microbatches", "--m", dest="num_microbatches", type=int, default=8, metavar="M",
                   help=m_help)
    w.add_argument("--recompute", choices=("none", "selective", "full"), default="selective",
                   help="activation recomputation (Korthikanti et al. 2022; default selective)")
    w.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=True,
                   help="split the remaining activations by tp too (default on)")
    w.add_argument("--bytes-per-param", choices=_CONVENTIONS, default="mixed_adamw",
                   help="bytes-per-parameter convention (default mixed_adamw: 16 B/param)")
    w.add_argument("--schedule", choices=_PLANNED_SCHEDULES, default=Schedule.ONE_F_ONE_B.value,
                   help="pipeline schedule (default 1f1b)")
    return w


def _time_parser(what: argparse._SubParsersAction) -> None:
    tm = what.add_parser(
        "time", help="step time, tokens/s and MFU of every layout that fits, ranked; each term shown",
        description="Time one training step of every layout that fits, at a fixed global batch, from a hardware "
                    "catalogue (vendor datasheets, each figure overridable) and sourced forms: compute at a stated "
                    "fraction of the peak, each axis' collectives in an alpha-beta model (NCCL's latencies, "
                    "nccl-tests' bus bandwidth) inside or across nodes by the layout's rank placement, named "
                    "overlaps, the pipeline bubble from the simulator. Ranks the layouts by step time and marks "
                    "those whose TP or CP crosses a node, with the reason.",
        epilog="Exit codes: 0 a layout fits, 1 nothing fits, 2 bad input. GB = 1e9 bytes, GB/s = 1e9 bytes/s, "
               "TFLOP/s = 1e12 FLOP/s.",
    )
    _model_args(tm, moe=False)
    h = tm.add_argument_group("hardware")
    h.add_argument("--gpus", type=int, required=True, metavar="N", help="GPUs in the run")
    h.add_argument("--hardware", choices=ACCELERATORS, default="h100-sxm",
                   help="the GPU and its server, from the catalogue (default h100-sxm)")
    h.add_argument("--hw", action="append", default=None, metavar="KEY=VALUE",
                   help="override a catalogue figure: peak_flops='800 TFLOP/s', hbm_bytes='80 GB', "
                        "hbm_bandwidth, intra_node_bandwidth (both directions), inter_node_bandwidth='25 GB/s' "
                        "(per GPU, one way), gpus_per_node, latency_base / latency_intra / latency_inter='5 us' "
                        "(repeatable)")
    h.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs per node (default: the hardware's); TP and CP may cross nodes, and pay for it")
    h.add_argument("--gpu-memory", default=None, metavar="SIZE", help="memory of one GPU (default: the hardware's)")
    h.add_argument("--reserve", default="0 GB", metavar="SIZE",
                   help="memory kept back per GPU for the CUDA context, buffers, fragmentation (default 0 GB)")
    w = _workload_args(tm, "with --global-batch unset, the global batch is M x gpus x micro-batch (default 8)")
    w.add_argument("--global-batch", type=int, default=None, metavar="B",
                   help="sequences per step, the same for every layout (m = B / (dp x micro-batch))")
    a = tm.add_argument_group("assumptions")
    a.add_argument("--compute-efficiency", default="0.6", metavar="X",
                   help="achievable fraction of the peak FLOP/s, 0 < X <= 1 (default 0.6, an assumption)")
    a.add_argument("--overlap", action="append", default=None, metavar="AXIS=MODE",
                   help="overlap of an axis: tp, cp, pp = none|compute; dp = none|backward; fsdp (ZeRO-3's "
                        "gathers) = none|compute (defaults tp=none cp=none pp=none dp=backward fsdp=compute)")
    out = tm.add_argument_group("output")
    out.add_argument("--top", type=int, default=15, metavar="N", help="layouts shown in the table (default 15)")
    out.add_argument("--all", action="store_true", help="show every layout that fits")
    out.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    _figure_option(out, "the step-time chart (stacked bars by term)")
    add_report_options(out)


def add_plan_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``plan`` (with ``memory``, ``time``, ``pp`` and ``layout``) to the subparsers ``sub``."""
    plan = sub.add_parser(
        "plan", help="plan a run: which layout fits, its bubble and communication; schedule and mesh figures",
        description="Plan a training run under named conventions: `plan memory` sizes every parallel layout of a "
                    "model on a set of GPUs and recommends one, `plan time` ranks the layouts that fit by step "
                    "time, `plan pp` simulates a pipeline schedule, "
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
    _model_args(mem, moe=True)
    moe = mem.add_argument_group("mixture of experts (a preset deepseek-v3 or mixtral-8x7b, or --num-experts with "
                                 "the shape above): memory per GPU under tp x ep x dp, total and active parameters")
    for flag, helptext in (("num-experts", "routed experts E"), ("experts-per-token", "routed experts per token k"),
                       ("expert-ffn", "hidden size of one expert's SwiGLU FFN"),
                       ("dense-layers", "first layers with a dense FFN (default 0)"),
                       ("dense-ffn", "hidden size of a dense layer's FFN"),
                       ("shared-experts", "shared experts per MoE layer (default 0)")):
        moe.add_argument(f"--{flag}", type=int, default=None, metavar="N", help=helptext)
    h = mem.add_argument_group("hardware")
    h.add_argument("--gpus", type=int, required=True, metavar="N", help="GPUs in the run")
    h.add_argument("--gpus-per-node", type=int, default=8, metavar="N",
                   help="GPUs per node (default 8); TP stays inside one")
    h.add_argument("--gpu-memory", default="80 GB", metavar="SIZE",
                   help="memory of one GPU: '80GB', '80 GiB' (default 80 GB)")
    h.add_argument("--reserve", default="0 GB", metavar="SIZE",
                   help="memory kept back per GPU for the CUDA context, buffers, fragmentation (default 0 GB)")
    _workload_args(mem, "micro-batches per step (pipeline micro-batches or accumulation steps; default 8)")
    lay = mem.add_argument_group("layout (give any of these to size one layout; the rest default to 1, ZeRO 0)")
    for axis in ("tp", "pp", "dp", "cp"):
        lay.add_argument(f"--{axis}", type=int, default=None, metavar="N",
                         help=f"{axis} degree" + (" (default: gpus / (tp*pp*cp))" if axis == "dp" else ""))
    lay.add_argument("--zero", type=int, default=None, metavar="STAGE", help="ZeRO stage 0..3")
    lay.add_argument("--ep", type=int, default=None, metavar="N", help="expert-parallel degree (an MoE model only)")
    out = mem.add_argument_group("output")
    out.add_argument("--sort", choices=tuple(SORT_KEYS), default=None,
                     help="the order of the layouts table (printed above it): lesson (default: fits first, then the "
                          "lesson's question, ZeRO-3 last, fewest GPUs per replica, bubble, larger tp, ZeRO stage, "
                          "communication, bytes), memory (fewest bytes per GPU), comm (fewest bytes sent per step) or "
                          "bubble (smallest bubble); each keeps the layouts that fit first. Not for MoE layouts")
    out.add_argument("--top", type=int, default=15, metavar="N", help="layouts shown in the table (default 15)")
    out.add_argument("--all", action="store_true", help="show every layout")
    out.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    _figure_option(out, "the memory chart (stacked bars per GPU)")
    add_report_options(out)

    _time_parser(what)

    pipe = what.add_parser(
        Axis.PP.value, aliases=[_OLD_PP], help="simulate a pipeline schedule: timeline, step ticks, bubble, peak in "
                                               "flight (the old name 'plan pipeline' works for one release)",
        description="Run a schedule tick by tick (forward t_f, backward t_b ticks per stage; communication free) "
                    "and compare its step time, bubble and activation stash with the closed forms. --torch replays "
                    "torch.distributed.pipelining's own schedule table (imports torch).",
        epilog="Exit codes: 0 the simulation agrees with the closed forms (and torch's table with the simulator, "
               "or a recorded torch finding), 1 a disagreement, 2 bad input.",
    )
    pipe.add_argument("--p", type=int, required=True, metavar="P", help="pipeline stages (ranks)")
    pipe.add_argument("--m", type=int, required=True, metavar="M", help="micro-batches")
    pipe.add_argument("--schedule", choices=_SIM_SCHEDULES, default=Schedule.ONE_F_ONE_B.value,
                      help="schedule (default 1f1b)")
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


def run_plan(args: argparse.Namespace) -> int:
    """Run ``distcheck plan WHAT``; returns the exit code (errors propagate as ConfigError)."""
    if args.plan_command == "memory":
        from distcheck.plan.cli_memory import run_memory

        return run_memory(args)
    if args.plan_command == "time":
        from distcheck.plan.cli_time import run_time

        return run_time(args)
    if args.plan_command in (Axis.PP, _OLD_PP):
        from distcheck.plan.cli_pipeline import run_pipeline

        if args.plan_command == _OLD_PP:  # one release of the old name, then it goes
            print("distcheck: 'plan pipeline' is deprecated: use 'plan pp' (one name per parallelism)",
                  file=sys.stderr)

        return run_pipeline(args)
    if args.plan_command == "layout":
        from distcheck.plan.cli_layout import run_layout

        return run_layout(args)
    from distcheck.core.errors import ConfigError

    raise ConfigError("plan", None, "needs what to plan: memory, time, pp or layout (see 'distcheck plan --help')")
