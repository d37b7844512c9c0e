"""The ``distcheck`` command line.

``distcheck check`` is the main job: on its built-in default it (a) runs the
reference-vs-closed-form properties with Hypothesis, the sympy proofs and the
mutant catalogue, (b) verifies every golden figure, and (c) runs the real-backend
checks on torch.distributed gloo worlds of 2 and 4 CPU processes. It prints one
table and exits 1 on any failure, 2 on bad input.

``distcheck audit KEY.toml ...`` audits answer keys (a bare name such as ``chapter``
names a key shipped with distcheck); ``distcheck audit --list`` lists the quantities a
key may name, ``distcheck audit --list-keys`` the shipped keys.

``distcheck plan`` (memory, pipeline, layout) lives in :mod:`distcheck.plan.cli`;
``--report DIR`` writes HTML and Markdown reports (:mod:`distcheck.reportdoc`).

``distcheck certify MODULE:OBJECT --contract NAME`` certifies a user's own layer
(:mod:`distcheck.certify.cli`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from distcheck.core.cache import hypothesis_storage
from distcheck.core.errors import DistcheckError
from distcheck.runners.backends import timeout_seconds
from distcheck.stages import stage_names

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
BACKENDS = ("gloo", "threaded", "nccl", "none")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one clear line and exit code 2."""

    def error(self, message: str) -> NoReturn:  # argparse API
        from distcheck.core.text import for_terminal

        self.exit(EXIT_USAGE, f"{self.prog}: error: {for_terminal(message)} (see '{self.prog} --help')\n")


class _SubcommandParser(_Parser):
    """The parser of a subcommand (``distcheck certify``, ``distcheck plan memory``): an argument it does not
    know is its own error, pointing to its own help, not the top-level parser's (argparse leaves unknown
    arguments of a subcommand to the top level, whose message names ``distcheck --help``)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def _stage_list(stages: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated stage names, each one of ``stages``."""

    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",")]
        unknown = [n for n in names if n not in stages]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown stage {unknown[0]!r} in {text!r} (choose from "
                                             f"{', '.join(stages)})")
        return names

    return parse


def _world_sizes(text: str) -> tuple[int, ...]:
    """argparse type of ``--world-sizes``: the rules of :func:`distcheck.core.validate.check_world_sizes`
    (the ones ``world-sizes`` of ``[tool.distcheck]`` is held to), on comma-separated integers."""
    from distcheck.core.errors import ConfigError
    from distcheck.core.validate import check_world_sizes

    items = [x.strip() for x in text.split(",")]
    try:
        sizes = [int(x) for x in items]  # a value of more than 4300 digits is a ValueError too
    except ValueError:
        raise argparse.ArgumentTypeError(f"world sizes must be comma-separated integers, got {text!r}") from None
    try:
        return check_world_sizes("--world-sizes", sizes)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"world sizes {exc.rule}, got {text!r}") from None


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seed must be an integer >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="distcheck",
        description="Certify the mathematics and the implementations of distributed training.",
        epilog="Exit codes: 0 all checks pass, 1 a check failed or a claim is wrong, 2 bad input.",
    )
    from distcheck import __version__
    from distcheck.plan.cli import add_plan_parser, add_report_options

    parser.add_argument("--version", action="version", version=f"distcheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_SubcommandParser)

    check = sub.add_parser(
        "check",
        help="run properties, golden figures and real-backend checks (the main job)",
        description=(
            "Run (a) the reference-vs-closed-form properties with Hypothesis, the sympy proofs and the "
            "mutant catalogue, (b) every golden figure in golden/, and (c) data-parallel exactness "
            "(DistributedDataParallel) and the layer checks on real torch.distributed worlds. "
            "Default: gloo worlds of 2 and 4 CPU processes."
        ),
    )
    check.add_argument("--profile", default=None, choices=("dev", "ci", "thorough"),
                       help="Hypothesis settings profile (default: ci)")
    check.add_argument("--seed", type=_seed, default=None, metavar="N",
                       help="seed of the properties stage (an integer >= 0); default 0 under the ci profile, a "
                            "fresh random seed under dev and thorough. Every run prints its seed; the same "
                            "profile and seed replay the same rows")
    check.add_argument("--backend", default="gloo", choices=BACKENDS,
                       help="backend for the real-backend checks: gloo (CPU processes), threaded "
                            "(in-process ranks), nccl (one GPU per rank), none (skip them); default gloo")
    check.add_argument("--world-sizes", type=_world_sizes, default=(2, 4), metavar="N[,N...]",
                       help="world sizes for the real-backend checks (default 2,4)")
    check.add_argument("--launcher", choices=("local", "torchrun"), default="local",
                       help="local: distcheck starts the ranks itself; torchrun: this process is one rank of "
                            "a world launched by torchrun (env:// rendezvous), rank 0 prints the table")
    stages = stage_names()
    check.add_argument("--only", action="extend", type=_stage_list(stages), metavar="STAGE[,STAGE...]",
                       help=f"run only these stages (comma-separated or repeated): {', '.join(stages)}")
    check.add_argument("--skip", action="extend", type=_stage_list(stages), default=[], metavar="STAGE[,STAGE...]",
                       help="skip these stages (comma-separated or repeated)")
    check.add_argument("--golden-dir", type=Path, default=None,
                       help="folder of golden answer keys (default: the golden/ shipped with distcheck)")
    check.add_argument("--timeout", type=timeout_seconds, default=120.0, metavar="SECONDS",
                       help="timeout of each multi-process step, at most 86400 (default 120)")
    check.add_argument("--format", choices=("table", "json"), default="table", help="report format")
    add_report_options(check)

    audit = sub.add_parser(
        "audit",
        help="audit answer keys (TOML): which figures hold, under which convention",
        description=(
            "Recompute every claim of each answer key from the closed forms and give a verdict: holds, "
            "holds-through-input-rounding, wrong, holds-under-another-convention, ambiguous or not-checkable. "
            "The key format is "
            "documented in docs/AUDIT.md."
        ),
    )
    audit.add_argument("keys", nargs="*", metavar="KEY.toml",
                       help="answer keys to audit: a file, or the name of a key shipped with distcheck "
                            "(e.g. chapter; see --list-keys)")
    audit.add_argument("--list", action="store_true", help="list the quantities a key may name, with inputs and units")
    audit.add_argument("--where", default=None, metavar="NAME",
                       help="print where the closed form NAME is defined, as path:line (names: --list)")
    audit.add_argument("--list-keys", action="store_true",
                       help="list the answer keys shipped with distcheck (the golden figures), by name")
    audit.add_argument("--format", choices=("table", "markdown", "json"), default=None,
                       help="report format (default: from --output's suffix, .json or .md, else table)")
    audit.add_argument("--output", type=Path, default=None, help="write the report to this file instead of stdout")
    audit.add_argument("--strict", action="store_true",
                       help="exit 1 unless every claim is decided: an ambiguous or not-checkable claim fails, "
                            "as a wrong claim or a contradiction does")
    add_report_options(audit, quiet=False)
    add_plan_parser(sub)

    from distcheck.certify.cli import add_parser as add_certify_parser  # `distcheck certify` (docs/CERTIFY.md)

    add_certify_parser(sub, world_sizes=_world_sizes, seconds=timeout_seconds)

    from distcheck.libs.cli import add_libs_parser  # `distcheck libs` (docs/LIBRARIES.md)

    add_libs_parser(sub, seed=_seed)
    from distcheck.zoo.cli import add_zoo_parser  # `distcheck zoo` (docs/ZOO.md)

    add_zoo_parser(sub, seed=_seed)
    return parser


def _run_check(args: argparse.Namespace) -> int:
    """``distcheck check``: refuse bad input (exit 2) before anything starts, then run the stages
    with :mod:`distcheck.stages` (here, or as one rank of a torchrun launch)."""
    from distcheck.stages import run_local, run_torchrun, select_stages

    stages = select_stages(args.only, args.skip, args.backend)
    if not stages:
        raise _UsageError("no stage left to run: --only and --skip (or --backend none) exclude every stage")
    if args.golden_dir is not None and "golden" in {s.name for s in stages} and not args.golden_dir.is_dir():
        raise _UsageError(f"--golden-dir {args.golden_dir} is not a folder")
    if args.launcher == "local" and any(s.needs_world for s in stages):
        _check_worlds(args.backend, args.world_sizes)
    if "golden" in {s.name for s in stages}:
        _check_golden_keys(args.golden_dir)
    if "certify" in {s.name for s in stages} and args.backend != "none" and (Path.cwd() / "pyproject.toml").is_file():
        from distcheck.certify.config import check_entries, load_config

        cfg = load_config(Path.cwd() / "pyproject.toml")
        check_entries(cfg.targets, cfg.entries_field)  # a bad table is bad input: exit 2
    if args.report is not None:
        if args.launcher == "torchrun":
            raise _UsageError("--report is not supported with --launcher torchrun")
        from distcheck.reportdoc import check_report_dir

        check_report_dir(args.report)
    return run_torchrun(args) if args.launcher == "torchrun" else run_local(args)


def _check_golden_keys(folder: Path | None) -> None:
    """Refuse, before anything starts, a golden folder holding a key that cannot be read or is not
    a golden key (a named pipe, a file over 4 MiB, invalid TOML, a claim without ``expect``): an
    AnswerKeyError naming the file (exit 2). A key that reads but does not reproduce is a FAIL row."""
    from distcheck.core.errors import GoldenError
    from distcheck.golden import golden_paths, load_golden

    if folder is None:
        return  # the shipped keys: checked by the test suite, their failure is a FAIL row
    try:
        paths = golden_paths(folder)
    except GoldenError as exc:
        raise _UsageError(f"--golden-dir: {exc}") from None
    for path in paths:
        load_golden(path)


def _check_worlds(backend: str, world_sizes: Sequence[int]) -> None:
    """Refuse, before anything starts, worlds this host cannot run (bad input: exit 2).

    An explicitly chosen backend that cannot run here (NCCL without enough GPUs) is an
    error rather than a table of skips, so a CI job cannot go green having checked nothing.
    """
    from distcheck.core.errors import BackendUnavailable, ConfigError
    from distcheck.runners.pool import MAX_LOCAL_RANKS, check_backend_available

    for ws in world_sizes:
        limit = MAX_LOCAL_RANKS.get(backend)
        if limit is not None and ws > limit:
            raise ConfigError("--world-sizes", ws, f"must be <= {limit} for --backend {backend} on one host")
        try:
            check_backend_available(backend, ws)
        except BackendUnavailable as exc:
            raise _UsageError(f"--backend {backend} cannot run here: {exc}") from None


def _run_audit(args: argparse.Namespace) -> int:
    from distcheck import audit
    from distcheck.audit.listing import closed_form_where, render_key_list

    if args.format is None:
        suffix = args.output.suffix.lower() if args.output is not None else ""
        args.format = {".json": "json", ".md": "markdown", ".markdown": "markdown"}.get(suffix, "table")
    if args.list and args.list_keys:
        raise _UsageError("--list and --list-keys cannot be combined")
    if args.output is not None:
        from distcheck.core.outputs import check_output_target

        check_output_target("--output", args.output)  # a folder, pipe, link or read-only file: refused first
    if args.where is not None:
        if args.list or args.list_keys or args.keys:
            raise _UsageError("--where takes no KEY.toml, --list or --list-keys")
        _emit(closed_form_where(args.where) + "\n", args.output)
        return EXIT_OK
    if args.list or args.list_keys:
        if args.keys:
            raise _UsageError(f"{'--list' if args.list else '--list-keys'} takes no KEY.toml")
        text = audit.render_quantity_list(args.format) if args.list else render_key_list(args.format)
        _emit(text, args.output)
        return EXIT_OK
    if not args.keys:
        raise _UsageError("audit needs at least one KEY.toml (or --list, --list-keys)")
    if args.report is not None:
        from distcheck.reportdoc import check_report_dir

        check_report_dir(args.report)
    from distcheck.golden import resolve_key

    results = [audit.audit_file(resolve_key(key)) for key in args.keys]
    text = audit.render(results, args.format)
    _emit(text, args.output)
    if args.report is not None:
        from distcheck.reportdoc import write_audit_report

        write_audit_report(args.report, results)
    return max(audit.audit_exit_code(r, strict=args.strict) for r in results)


def _emit(text: str | None, output: Path | None) -> None:
    """Write ``text`` to stdout, or atomically to ``output`` (:func:`distcheck.core.atomic.write_text_atomic`:
    a temporary file beside it, then a rename; the temporary file never outlives an interruption)."""
    if text is None:
        return
    if output is None:
        from distcheck.core.text import clean

        text = clean(text)  # a key's title cannot clear the screen or move the cursor
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    from distcheck.core.atomic import write_text_atomic

    try:
        write_text_atomic(output, text)  # removes its temporary file on every exit path, signals included
    except OSError as exc:
        raise _UsageError(f"--output {output}: {exc.strerror or exc}") from None


class _UsageError(DistcheckError):
    pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``distcheck`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # SIGTERM (e.g. a CI timeout) and Ctrl-C unwind main(), so rank pools close and clean up; neither is lost
    # when it arrives inside a garbage-collector callback (see _terminate)
    _TERM["state"] = "idle"
    previous = ({sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGINT)}
                if _is_main_thread() else {})
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        with hypothesis_storage():  # Hypothesis' files in distcheck's cache folder, not in the current folder
            code = _run_command(args, argv)
        if _TERM["state"] == "raised":  # raised inside a callback whose exceptions Python drops (an at-fork hook)
            _TERM["state"] = "handled"
            interrupted = _TERM.get("signum") == signal.SIGINT
            sys.stderr.write(f"distcheck: {'interrupted' if interrupted else 'terminated'} (the signal reached "
                             "code that drops exceptions; the run went on to its end)\n")
            return 130 if interrupted else 143
        return code
    except (DistcheckError, OSError) as exc:
        from distcheck.core.errors import AnswerKeyError, ConfigError, UnknownQuantityError
        from distcheck.core.text import for_terminal

        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        sys.stderr.write(f"distcheck: error: {for_terminal(first)}\n")
        usage = (_UsageError, AnswerKeyError, ConfigError, UnknownQuantityError, OSError)
        return EXIT_USAGE if isinstance(exc, usage) else EXIT_FAIL
    except SystemExit as exc:  # distcheck never exits from inside a command: code it ran did (a target, a library)
        from distcheck.core.text import for_terminal

        sys.stderr.write(f"distcheck: error: code run by `distcheck {args.command}` called "
                         f"sys.exit({for_terminal(repr(exc.code))}): the run stopped there, nothing it had "
                         "left was checked\n")
        return EXIT_FAIL
    except KeyboardInterrupt:
        _TERM["state"] = "handled"
        sys.stderr.write("distcheck: interrupted\n")
        return 130
    except _Terminated:
        _TERM["state"] = "handled"
        sys.stderr.write("distcheck: terminated\n")
        return 143
    finally:
        for sig, handler in previous.items():
            # run as the program (argv from sys.argv): a signal after main() returns still exits 130 / 143
            signal.signal(sig, _exit_by_signal if argv is None else handler)


def _exit_by_signal(signum: int, frame: FrameType | None) -> None:
    """SIGINT or SIGTERM after :func:`main` returned (the table printed, the process on its way out):
    exit at once with 128 + the signal's number (130, 143), as a shell reports a program it stopped,
    never by the signal itself (a return code of -2 or -15). Standard output is flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, RuntimeError, ValueError):  # closed, or a flush already under way
            pass
    os._exit(128 + signum)


def _run_command(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Run the parsed subcommand; return its exit code."""
    if args.command == "check":
        return _run_check(args)
    if args.command == "plan":
        from distcheck.plan.cli import run_plan

        return run_plan(args)
    if args.command == "certify":
        from distcheck.certify.cli import run as run_certify

        args.argv = list(argv) if argv is not None else sys.argv[1:]
        return run_certify(args)
    if args.command == "libs":  # ---- distcheck libs (distcheck.libs.cli)
        from distcheck.libs.cli import run_libs_command

        return run_libs_command(args)
    if args.command == "zoo":
        from distcheck.zoo.cli import run_zoo

        return run_zoo(args)
    return _run_audit(args)


class _Terminated(BaseException):
    """Raised by the SIGTERM handler of :func:`main`."""


#: "idle"; "pending" (SIGTERM or SIGINT came inside a garbage-collector callback: not raised yet, delivered
#: again); "raised" (main() is unwinding, or the exception was dropped where Python ignores them: main() exits
#: with the signal's code all the same); "handled" (main() has unwound)
_TERM: dict = {"state": "idle", "raised_at": 0.0}
#: seconds before a pending signal is delivered again
_RESEND_S = 0.2
#: seconds after a raise in which another signal is ignored
_GRACE_S = 2.0


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: unwind :func:`main` (pools closed, folders removed), exit 143; SIGINT (Ctrl-C): the same
    as a KeyboardInterrupt, exit 130.

    An exception raised by a signal handler is lost (printed as "Exception ignored") when the
    handler happens to run inside a callback whose exceptions Python ignores, such as a
    garbage-collector callback (Hypothesis installs one). So the handler does not raise inside
    one: the signal is pending, delivered again every :data:`_RESEND_S` seconds until it can
    raise. Once raised, another signal within :data:`_GRACE_S` seconds is ignored, so that it
    cannot interrupt the clean-up (or ``main``'s last words) with a second exception; a later one
    raises again (the first was swallowed somewhere, or the user insists)."""
    if _TERM["state"] == "handled" or (_TERM["state"] == "raised"
                                        and time.monotonic() - _TERM["raised_at"] < _GRACE_S):
        return
    if _in_gc_callback(frame):  # the exception would be printed and dropped: wait for the next delivery
        _TERM["state"] = "pending"
        timer = threading.Timer(_RESEND_S, _resend, (signum,))
        timer.daemon = True
        timer.start()
        return
    _TERM["state"], _TERM["raised_at"], _TERM["signum"] = "raised", time.monotonic(), signum
    raise KeyboardInterrupt() if signum == signal.SIGINT else _Terminated()


def _in_gc_callback(frame: FrameType | None) -> bool:
    """True inside a garbage-collector callback or logging's at-fork hooks (run by every fork of a rank pool),
    whose exceptions Python prints and drops."""
    import gc
    import logging

    at_fork = (getattr(logging, name, None) for name in ("_acquireLock", "_releaseLock", "_prepareFork",
                                                          "_afterFork"))
    codes = {getattr(cb, "__code__", None) for cb in (*gc.callbacks, *at_fork)} - {None}
    while frame is not None and codes:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _resend(signum: int) -> None:
    if _TERM["state"] == "pending":
        os.kill(os.getpid(), signum)


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
