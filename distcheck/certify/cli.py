"""``distcheck certify``: the command line of the certification engine.

    distcheck certify mypkg.layers:MyRowParallel --contract row-parallel-linear --world-sizes 2,4
    distcheck certify                    # every [[tool.distcheck.certify]] target of ./pyproject.toml
    distcheck certify --list-contracts

The config (``--config``, else the nearest ``pyproject.toml``) is read and checked on every run, with a
target or without; its ``[tool.distcheck]`` settings are the flags' defaults (``_jobs``).

Exit codes: 0 certified, 1 a property failed, 2 bad input (one line on stderr: an unknown contract
or option with close matches, a target that does not import or does not follow the contract's
protocol or whose module exits while it is imported, a backend that cannot run here, a config file that
cannot be read or breaks a rule) or nothing certified: a target none of whose properties
was able to fail (every row a skip, e.g. a world below the contract's smallest; stderr says
"nothing here can fail" and why, and the certificate says so too, never "certified").
:func:`add_parser` is called by :mod:`distcheck.cli`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distcheck.core.errors import ConfigError
from distcheck.core.outputs import check_output_target

if TYPE_CHECKING:
    from distcheck.certify.certificate import Certification

__all__ = ["add_parser", "run", "render_contracts"]

BACKENDS = ("gloo", "threaded", "nccl")
#: the most examples one world step takes (``--batch``): Hypothesis draws a list of that many cases, and
#: refuses lists much longer than this
MAX_BATCH = 1024


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key.strip(), value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _batch(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to {MAX_BATCH}, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_parser(sub: argparse._SubParsersAction, *, world_sizes: Callable[[str], object],
               seconds: Callable[[str], float]) -> argparse.ArgumentParser:
    """Add the ``certify`` subcommand to ``sub`` (argparse subparsers); ``world_sizes`` and
    ``seconds`` are the argument types ``distcheck check`` uses for the same flags."""
    p = sub.add_parser(
        "certify",
        help="certify your own parallel layer on real worlds under a contract (exit 0 certified, 1 failed, "
             "2 bad input or nothing here can fail)",
        description=(
            "Run a contract's Hypothesis properties on TARGET (module:object) on real torch.distributed worlds: "
            "every example on every rank, outputs, gradients and collectives checked against the reference and "
            "the closed forms. Without TARGET, run every [[tool.distcheck.certify]] entry of pyproject.toml."),
        epilog="Exit codes: 0 certified, 1 a property failed, 2 bad input, or nothing here can fail (every property "
               "of a target skipped: a world below the contract's smallest, see --list-contracts). Contracts: "
               "--list-contracts.")
    p.add_argument("target", nargs="?", default=None, metavar="MODULE:OBJECT",
                   help="the object to certify: a module class, a torch parallel style, a plan dict or a factory")
    p.add_argument("--contract", default=None, metavar="NAME", help="the contract to certify it under")
    p.add_argument("--world-sizes", type=world_sizes, default=None, metavar="N[,N...]",
                   help="world sizes (default 2, or the config's)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="gloo (CPU processes, default, or the config's), threaded (in-process ranks) or nccl "
                        "(one GPU per rank)")
    p.add_argument("--examples", type=_positive_int, default=None,
                   help="Hypothesis examples per property (default: the config's, else the profile's)")
    p.add_argument("--batch", type=_batch, default=1,
                   help=f"examples per world step, 1 to {MAX_BATCH} (default 1; larger batches amortize the round "
                        "trip)")
    p.add_argument("--seed", type=_seed, default=None,
                   help="Hypothesis seed (default: the config's, else 0 under the derandomized ci profile, else "
                        "drawn and recorded)")
    p.add_argument("--profile", choices=("dev", "ci", "thorough"), default=None,
                   help="Hypothesis settings profile (default ci, or the config's)")
    p.add_argument("--dtypes", default=None, metavar="DTYPE[,DTYPE...]",
                   help="float64, float32, bfloat16 (default: the config's, else the contract's)")
    p.add_argument("--option", action="append", type=_option, default=[], metavar="NAME=VALUE",
                   help="a contract option, e.g. gather_output=false (repeatable)")
    p.add_argument("--certificate", action="append", default=[], metavar="PATH",
                   help="write the certificate to PATH (.json or .md; repeatable)")
    p.add_argument("--report", type=Path, default=None, metavar="DIR",
                   help="also write DIR/report.html (self-contained) and DIR/report.md: a summary per target, "
                        "the failures grouped per property with one replay command each, then every row")
    p.add_argument("--launcher", choices=("local", "torchrun"), default="local",
                   help="local: distcheck starts the ranks; torchrun: this process is one rank of a torchrun launch")
    p.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                   help="seconds one world step (an example, or a --batch of them) may take, default 120 (or "
                        "[tool.distcheck] timeout); a step past it fails the target as hung, with every stuck "
                        "rank's stack, and skips the properties left")
    p.add_argument("--config", default=None, metavar="PYPROJECT",
                   help="pyproject.toml to read (default: the nearest), with a target or without: a file that cannot "
                        "be read or breaks a rule is bad input (exit 2); its [tool.distcheck] settings are the "
                        "defaults of these flags, its [[tool.distcheck.certify]] entries run only without a target")
    p.add_argument("--format", choices=("table", "json"), default="table", help="report format")
    p.add_argument("--list-contracts", action="store_true", help="list the contracts, their properties and options")
    return p


def render_contracts() -> str:
    """Every contract with its summary, properties (and regimes) and options."""
    from distcheck.engine.contracts.contract import contracts

    lines = []
    for c in contracts():
        lines.append(f"{c.name} ({c.parallelism}): {c.summary}")
        lines.append(f"    from world size {c.min_world_size}: {c.min_world_reason}")
        for prop in c.properties:
            lines.append(f"    property {prop.name} [{prop.regime}]: {prop.statement}")
        for opt in c.options:
            lines.append(f"    option {opt.name}={opt.default!r}: {opt.doc}")
    return "\n".join(lines) + "\n"


class _Job:
    def __init__(self, target: str, contract: str, world_sizes: list[int], backend: str, dtypes: list[str] | None,
                 examples: int | None, options: dict) -> None:
        self.target, self.contract, self.world_sizes, self.backend = target, contract, world_sizes, backend
        self.dtypes, self.examples, self.options = dtypes, examples, options


def _jobs(args: argparse.Namespace) -> tuple[list[_Job], str, int | None, float]:
    """The certifications to run, the profile, the seed and the timeout.

    The config (``--config``, else the nearest ``pyproject.toml``) is read and checked on every run, with a
    target or without: a file that cannot be read, is not TOML or breaks a rule under ``[tool.distcheck]`` is
    a ConfigError (exit 2) before anything runs. Its settings (``timeout``, ``profile``, ``seed``) and its
    defaults (``world-sizes``, ``backend``, ``dtypes``, ``examples``) apply to a command-line target as to its
    own entries, a flag overriding each; its ``[[tool.distcheck.certify]]`` entries run only without a target."""
    from distcheck.certify.config import check_entries, load_config

    cli_options = dict(args.option)
    cfg = load_config(args.config, field="--config") if args.config is not None else load_config()
    seed = args.seed if args.seed is not None else cfg.seed
    profile, timeout = args.profile or cfg.profile, args.timeout or cfg.timeout
    if args.target is not None:
        if args.contract is None:
            from distcheck.engine.contracts.contract import contracts

            raise ConfigError("--contract", None, "is required with a target (contracts: "
                                                  f"{', '.join(c.name for c in contracts())})")
        check_entries(cfg.targets, cfg.entries_field)  # not run, but bad input all the same
        job = _Job(args.target, args.contract, list(args.world_sizes or cfg.world_sizes), args.backend or cfg.backend,
                   args.dtypes or cfg.dtypes, args.examples or cfg.examples, cli_options)
        return [job], profile, seed, timeout
    if args.contract is not None or cli_options:
        raise ConfigError("target", None, "is required with --contract or --option (MODULE:OBJECT)")
    if not cfg.targets:
        where = cfg.path or "pyproject.toml (none found)"
        raise ConfigError("target", None, f"is required: give MODULE:OBJECT --contract NAME, or list targets under "
                                          f"[[tool.distcheck.certify]] in {where}")
    check_entries(cfg.targets, cfg.entries_field)  # the file's own mistakes, named in it
    jobs = [_Job(e.target, e.contract, list(args.world_sizes or e.world_sizes), args.backend or e.backend,
                 args.dtypes or e.dtypes, args.examples or e.examples, e.options) for e in cfg.targets]
    return jobs, profile, seed, timeout


def _check_jobs(jobs: list[_Job], *, from_config: bool) -> None:
    """Refuse, before anything runs, a contract, an option or a dtype that a job cannot take."""
    from distcheck.certify.config import TargetEntry, check_entries

    entries = [TargetEntry(target=j.target, contract=j.contract, dtypes=j.dtypes, options=j.options) for j in jobs]
    check_entries(entries, "[[tool.distcheck.certify]]" if from_config else "command line")


def _check_worlds(jobs: list[_Job]) -> None:
    """Refuse, before anything starts, worlds this host cannot run (bad input: exit 2)."""
    from distcheck.core.errors import BackendUnavailable
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.runners.pool import MAX_LOCAL_RANKS, check_backend_available

    for job in jobs:
        if not get_contract(job.contract).needs_world:  # runs in this process: no world to start
            continue
        for ws in job.world_sizes:
            limit = MAX_LOCAL_RANKS.get(job.backend)
            if limit is not None and ws > limit:
                raise ConfigError("--world-sizes", ws, f"must be <= {limit} for --backend {job.backend} on one host")
            try:
                check_backend_available(job.backend, ws)
            except BackendUnavailable as exc:
                raise ConfigError("--backend", job.backend, f"cannot run here: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Run ``distcheck certify`` from parsed arguments; return the exit code (see the module doc)."""
    if args.list_contracts:
        sys.stdout.write(render_contracts())
        return 0
    from distcheck.certify.config import importable_from_current_folder

    importable_from_current_folder()  # module:object names are resolved from the current folder, as python -m does
    for path in args.certificate:
        if not path.lower().endswith((".json", ".md")):
            raise ConfigError("--certificate", path, "must end in .json or .md")
        # a folder, a named pipe, a device, a symbolic link or a read-only file is refused before the work
        check_output_target("--certificate", path)
    if getattr(args, "report", None) is not None:
        from distcheck.reportdoc import check_report_dir

        check_report_dir(args.report)  # bad input before anything runs
    jobs, profile, seed, timeout = _jobs(args)
    _check_jobs(jobs, from_config=args.target is None)
    args.named_targets = args.target is None  # [tool.distcheck] targets: every row names its target
    if args.launcher == "torchrun":
        return _run_torchrun(args, jobs, profile, seed, timeout)
    _check_worlds(jobs)
    return _finish(args, _certify_all(jobs, profile, seed, timeout, batch=args.batch), time.perf_counter())


def _certify_all(jobs: list[_Job], profile: str, seed: int | None, timeout: float, world: Any = None,
                 launcher: str = "local", batch: int = 1) -> list[Certification]:
    from distcheck.certify.engine import certify, default_seed

    seed = default_seed(profile) if seed is None else seed  # one seed for the whole run, recorded
    return [certify(job.target, job.contract, world=world, world_sizes=job.world_sizes, backend=job.backend,
                    examples=job.examples, seed=seed, profile=profile, dtypes=job.dtypes, options=job.options,
                    timeout_s=timeout, launcher=launcher, batch=batch)
            for job in jobs]


def _command(args: argparse.Namespace, certs: list[Certification]) -> str:
    """The command that reproduces the whole run: this one, with the seed made explicit."""
    argv = list(getattr(args, "argv", None) or ["certify"])
    seed = certs[0].seed if certs else None
    if "--seed" not in argv and seed is not None:
        argv += ["--seed", str(seed)]
    head = ["distcheck"]
    if args.launcher == "torchrun":
        n = certs[0].world_sizes[0] if certs and certs[0].world_sizes else "N"
        head = ["torchrun", "--standalone", f"--nproc-per-node={n}", "-m", "distcheck"]
    return " ".join(shlex.quote(str(a)) for a in [*head, *argv])


def _finish(args: argparse.Namespace, certs: list[Certification], started: float) -> int:
    from distcheck.certify.certificate import NOTHING_CAN_FAIL, Certificate
    from distcheck.certify.config import target_rows
    from distcheck.core.results import exit_code
    from distcheck.report import print_report

    named = getattr(args, "named_targets", False)
    rows = [row for c in certs for row in (target_rows(c) if named else c.rows())]
    title = "distcheck certify" + "".join(f" {c.target} ({c.contract})" for c in certs[:1] if len(certs) == 1)
    print_report(rows, title=title, seconds=sum(c.seconds for c in certs), fmt=args.format)
    certificate = Certificate(certs, command=_command(args, certs))
    if args.certificate:
        certificate.write_set(args.certificate)  # the pair as one set: all old or all new
    if getattr(args, "report", None) is not None:
        from distcheck.certify.report import write_certify_report

        write_certify_report(args.report, certificate, title=title)
    code = exit_code(rows)
    vacuous = [c for c in certs if not c.can_fail]
    if code == 0 and vacuous:  # nothing certified: not a pass
        for c in vacuous:
            sys.stderr.write(f"distcheck: error: {c.target} under {c.contract}: {NOTHING_CAN_FAIL}: "
                             f"{'; '.join(c.skip_reasons()) or 'no property ran'}\n")
        return 2
    return code


def _run_torchrun(args: argparse.Namespace, jobs: list[_Job], profile: str, seed: int | None, timeout: float) -> int:
    from distcheck.certify.launch import LeaderWorld, follow, side_group
    from distcheck.runners.torchrun_world import FINAL_EXCHANGE_TIMEOUT_S, TorchrunWorld

    backends = {job.backend for job in jobs}
    if backends - {"gloo", "nccl"} or len(backends) > 1:
        raise ConfigError("--backend", sorted(backends)[0], "must be one of 'gloo', 'nccl' under torchrun "
                                                            "(one backend per launch)")
    world = TorchrunWorld(backend=backends.pop(), timeout_s=timeout)
    world.start()
    try:
        side = side_group(FINAL_EXCHANGE_TIMEOUT_S)
        if world.rank != 0:
            return follow(world, side)
        leader = LeaderWorld(world, side)
        code = 1
        try:
            certs = _certify_all(jobs, profile, seed, timeout, world=leader, launcher="torchrun", batch=args.batch)
            code = _finish(args, certs, time.perf_counter())
        except BaseException as exc:
            from distcheck.core.errors import UnknownQuantityError

            code = 2 if isinstance(exc, (ConfigError, UnknownQuantityError)) else 1
            raise
        finally:
            leader.stop(code)  # every rank exits with rank 0's code
        return code
    finally:
        world.close()
