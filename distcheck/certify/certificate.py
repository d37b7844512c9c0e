"""Verdicts and the certificate: what ``distcheck certify`` keeps, in JSON and in Markdown.

A :class:`Certification` is one target under one contract: every property's verdict at every
world size and dtype. A :class:`Certificate` gathers the certifications of one run with what
makes it reproducible: the seed and profile, the versions of Python, torch, distcheck and
Hypothesis, and the command line. Running that command again gives the same verdicts and
counterexamples; only ``created``, the ``seconds`` fields and a hang's ``stacks`` change (:func:`stable_view`).

The files of one run (``--certificate a.json --certificate a.md``) are written as one set
(:meth:`Certificate.write_set`, :func:`distcheck.core.outputs.write_files`): staged beside their
targets, then renamed in, so a reader finds them all old or all new.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from distcheck.certify.compositions import CompositionRow, composition_columns, verdict_text
from distcheck.certify.identity import CodeIdentity
from distcheck.core.results import NOTHING_CAN_FAIL
from distcheck.engine.contracts.errors import CertificationFailed, NothingCanFail
from distcheck.report import FAIL, PASS, SKIP, CheckResult

__all__ = ["PropertyVerdict", "Certification", "Certificate", "versions", "write_atomic", "stable_view",
           "FORMAT"]

#: the certificate's format tag
FORMAT = "distcheck-certificate/1"
#: fields that change between identical runs (a hang's stacks carry thread ids and start-up frames)
VOLATILE = ("created", "seconds", "stacks")


@dataclass
class PropertyVerdict:
    """One property of one contract at one world size and dtype.

    Attributes:
        property: the property's name; ``statement``: what must hold; ``regime``: bitwise, bounded or exact.
        dtype, world_size, backend: where it ran.
        verdict: ``"pass"``, ``"FAIL"`` or ``"skip"``.
        examples: Hypothesis examples run (on failure: up to the failure plus the shrinking replays).
        max_error, bound: the largest error seen and the largest bound it was held to (bitwise: 0).
        counterexample: the shrunk case (its repr); failure: the full reason (ranks, expected, got,
            max error, bound); ranks: the ranks at fault; reproduce: the command that replays it.
        seconds: wall time of the property's runs.
        note: on a pass, what it found that the statement does not say (the outcome's ``note``).
        hung: a FAIL because a world step outlived the timeout (the case is the smallest that hung, shrunk
            as any failure: :mod:`distcheck.certify.hangs`); ``stacks`` maps each stuck rank of that case to
            its Python stack (faulthandler's dump).
        took_down: on a FAIL caused by a crash (a rank raised or died) that failed several properties at
            once, every property that crash failed, in order (this one included); empty otherwise. Each of
            them is a FAIL of its own; reports show the crash once (:meth:`Certification.failure_groups`).
    """

    property: str
    statement: str
    regime: str
    dtype: str
    world_size: int
    backend: str
    verdict: str
    examples: int = 0
    max_error: float | None = None
    bound: float | None = None
    counterexample: str | None = None
    failure: str | None = None
    ranks: list[int] = field(default_factory=list)
    reproduce: str | None = None
    examples_until_failure: int | None = None
    seconds: float = 0.0
    note: str = ""
    hung: bool = False
    stacks: dict[int, str] = field(default_factory=dict)
    took_down: list[str] = field(default_factory=list)

    def describe(self, contract: str, *, stacks: bool = True) -> str:
        """The full one-paragraph account of a failure (or the statement of a pass or the skip reason);
        a hang's stacks follow it, one block per rank headed ``--- rank R ---`` (unless ``stacks=False``)."""
        where = f"{contract}.{self.property}[{self.dtype}] at world size {self.world_size} ({self.backend})"
        if self.verdict == PASS:
            found = f": {self.note}" if self.note else ""
            return f"{where}: {self.statement} ({self.examples} examples, {self.regime}){found}"
        if self.verdict == SKIP:
            return f"{where}: skip: {self.failure}"
        case = "Shrunk case that hung" if self.hung else "Shrunk case"
        crash = (f" (one crash took down {len(self.took_down)} properties: {', '.join(self.took_down)})"
                 if self.took_down else "")
        text = (f"{where} FAILED{crash}: {self.failure}. {case}: {self.counterexample}. "
                f"Reproduce: {self.reproduce}")
        if stacks and self.stacks:
            text += "\n" + self.stack_text()
        return text

    def stack_text(self) -> str:
        """The stuck ranks' stacks, one block per rank headed ``--- rank R ---`` (empty when none)."""
        if not self.stacks:
            return ""
        return "Stacks of the stuck ranks:\n" + "\n".join(
            f"--- rank {r} ---\n{self.stacks[r].rstrip()}" for r in sorted(self.stacks))


@dataclass
class Certification:
    """One target certified under one contract (what :func:`distcheck.certify.certify` returns).

    ``distribution``/``version``: the installed distribution that provides the target (or the library
    it wraps), None for code of a checkout; ``code``: which code ran (:class:`~distcheck.certify.identity.
    CodeIdentity`: the source file, its sha256 or the distribution's RECORD's, the git commit and dirty flag);
    ``compositions``: the compositions drawn and each property's verdict on each
    (:class:`~distcheck.certify.compositions.CompositionRow`), for a contract that names them
    (:meth:`~distcheck.engine.contracts.contract.Contract.composition`; empty otherwise).
    """

    target: str
    contract: str
    backend: str
    world_sizes: list[int]
    dtypes: list[str]
    options: dict
    seed: int
    profile: str
    max_examples: int | None
    launcher: str = "local"
    batch: int = 1
    distribution: str | None = None
    version: str | None = None
    code: CodeIdentity | None = None
    verdicts: list[PropertyVerdict] = field(default_factory=list)
    seconds: float = 0.0
    compositions: list[CompositionRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when certified: no property failed, and at least one was able to fail (ran, not skipped)."""
        return not self.failures and self.can_fail

    @property
    def can_fail(self) -> bool:
        """False when every verdict is a skip (:data:`NOTHING_CAN_FAIL`): nothing was certified."""
        return any(v.verdict != SKIP for v in self.verdicts)

    @property
    def verdict(self) -> str:
        """``"certified"``, ``"FAILED"`` or :data:`NOTHING_CAN_FAIL`."""
        return "FAILED" if self.failures else "certified" if self.can_fail else NOTHING_CAN_FAIL

    def skip_reasons(self) -> list[str]:
        """The distinct reasons of the skips, in order."""
        return list(dict.fromkeys(v.failure or "skip" for v in self.verdicts if v.verdict == SKIP))

    @property
    def failures(self) -> list[PropertyVerdict]:
        return [v for v in self.verdicts if v.verdict == FAIL]

    def __bool__(self) -> bool:
        return self.ok

    def failure_groups(self) -> list[list[PropertyVerdict]]:
        """The failures, one group per failure: a crash that took down several properties at one world size
        and dtype is one group of all their verdicts; any other failure is a group of one."""
        groups: dict[tuple, list[PropertyVerdict]] = {}
        for v in self.failures:
            key = (v.world_size, v.dtype, tuple(v.took_down)) if v.took_down else (id(v),)
            groups.setdefault(key, []).append(v)
        return list(groups.values())

    def composition_table(self) -> tuple[list[str], list[list[str]]]:
        """The "Compositions drawn" table: its header (world size, dtype, the contract's columns, examples,
        one column per property) and one row per composition (verdicts ``pass``, ``skip``, ``FAIL (k of n)``)."""
        columns = composition_columns(self.compositions)
        props = list(dict.fromkeys(p for r in self.compositions for p in r.verdicts))
        head = ["world size", "dtype", *columns, "examples", *props]
        rows = [[str(r.world_size), r.dtype, *(r.columns.get(c, "-") for c in columns), str(r.examples),
                 *(verdict_text(r, p) for p in props)] for r in self.compositions]
        return head, rows

    def report(self) -> str:
        """Every verdict, one paragraph each; failures in full."""
        head = f"{self.target} under {self.contract}: {self.verdict}"
        return "\n".join([head] + [f"  {v.describe(self.contract)}" for v in self.verdicts])

    def assert_certified(self) -> Certification:
        """Return self when every property holds; else raise CertificationFailed with each failure in full,
        or :class:`~distcheck.engine.contracts.errors.NothingCanFail` (a CertificationFailed; under pytest, with
        distcheck's plugin, a skip) with the reasons when no property was able to fail."""
        __tracebackhide__ = True  # pytest shows the caller's line, not this one
        if self.failures:  # a crash that took down several properties, once
            text = "\n".join(group[0].describe(self.contract) for group in self.failure_groups())
            raise CertificationFailed(f"{self.target} is not certified under {self.contract}:\n{text}")
        if not self.can_fail:
            raise NothingCanFail(f"{self.target} is not certified under {self.contract}: {NOTHING_CAN_FAIL} "
                                 f"({'; '.join(self.skip_reasons()) or 'no property ran'})")
        return self

    def rows(self) -> list[CheckResult]:
        """One :class:`~distcheck.core.results.CheckResult` per verdict (check ``contract.property[dtype]``)."""
        return [CheckResult(check=f"{self.contract}.{v.property}[{v.dtype}]", backend=self.backend,
                            verdict=v.verdict, world_size=v.world_size, examples=v.examples,
                            max_error=v.max_error, bound=v.bound,
                            detail=(f"{v.statement} ({v.regime})" + (f": {v.note}" if v.note else "")
                                    if v.verdict == PASS
                                    else f"{self.target}: {v.describe(self.contract)}"),
                            extra={"target": self.target, "seed": self.seed, "profile": self.profile,
                                   "reproduce": v.reproduce,
                                   **({"took_down": [f"{self.contract}.{p}[{v.dtype}]" for p in v.took_down]}
                                      if v.took_down else {})})
                for v in self.verdicts]

    def to_dict(self) -> dict:
        return asdict(self)


def versions() -> dict[str, str | None]:
    """Versions of Python, distcheck, Hypothesis, numpy and torch (None when not installed)."""
    import importlib.metadata

    import hypothesis
    import numpy

    out: dict[str, str | None] = {"python": platform.python_version()}
    try:
        out["distcheck"] = importlib.metadata.version("distcheck")
    except importlib.metadata.PackageNotFoundError:
        from distcheck import __version__

        out["distcheck"] = __version__
    out["hypothesis"] = hypothesis.__version__
    out["numpy"] = numpy.__version__
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:
        out["torch"] = None
    return out


@dataclass
class Certificate:
    """The record of one ``distcheck certify`` run (one or more targets)."""

    certifications: list[Certification]
    command: str
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"))
    environment: dict = field(default_factory=versions)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.certifications)

    @property
    def verdict(self) -> str:
        """``"certified"`` (every certification), ``"FAILED"`` (one failed), else :data:`NOTHING_CAN_FAIL`."""
        if any(c.failures for c in self.certifications):
            return "FAILED"
        return "certified" if self.ok and self.certifications else NOTHING_CAN_FAIL

    def to_json(self) -> str:
        verdict = {"certified": "certified", "FAILED": "failed"}.get(self.verdict, self.verdict)
        data = {"format": FORMAT, "verdict": verdict, "command": self.command,
                "created": self.created, "environment": self.environment,
                "certifications": [c.to_dict() for c in self.certifications]}
        return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"

    def to_markdown(self) -> str:
        env = self.environment
        lines = [f"# distcheck certificate: {self.verdict}", "",
                 f"Reproduce with `{self.command}`.", "",
                 f"Created {self.created} with Python {env.get('python')}, distcheck {env.get('distcheck')}, "
                 f"torch {env.get('torch')}, Hypothesis {env.get('hypothesis')}, numpy {env.get('numpy')}.", ""]
        for c in self.certifications:
            version = f" (distribution {c.distribution} {c.version})" if c.distribution else ""
            lines += [f"## `{c.target}`{version} under `{c.contract}`: {c.verdict}", "",
                      f"Backend {c.backend} ({c.launcher}), world sizes {', '.join(map(str, c.world_sizes))}, dtypes "
                      f"{', '.join(c.dtypes)}, seed {c.seed}, profile {c.profile}"
                      + (f", {c.max_examples} examples per property" if c.max_examples else "")
                      + (f", options {json.dumps(c.options, sort_keys=True)}" if c.options else "") + ".", "",
                      *([f"Code: {_md_escape(c.code.describe())}.", ""] if c.code is not None else []),
                      "| property | dtype | world size | regime | examples | verdict | max error | bound |",
                      "|---|---|---|---|---|---|---|---|"]
            for v in c.verdicts:
                lines.append(f"| {v.property} | {v.dtype} | {v.world_size} | {v.regime} | {v.examples} | "
                             f"{v.verdict} | {_num(v.max_error)} | {_num(v.bound)} |")
            shown: set[tuple] = set()  # a crash that took down several properties: described once
            for v in c.verdicts:
                crash = (v.world_size, v.dtype, tuple(v.took_down))
                if v.took_down and crash in shown:
                    continue
                shown.add(crash)
                if v.verdict != PASS or v.note:
                    lines += ["", f"- {_md_escape(v.describe(c.contract, stacks=False))}"]
                    if v.stacks:
                        lines += ["", "  ```text", *(f"  {line}" for line in v.stack_text().splitlines()), "  ```"]
            if c.compositions:
                head, rows = c.composition_table()
                lines += ["", "### Compositions drawn", "", "| " + " | ".join(head) + " |",
                          "|" + "---|" * len(head), *("| " + " | ".join(map(_md_escape, r)) + " |" for r in rows)]
            lines.append("")
        return "\n".join(lines)

    def write(self, path: str | os.PathLike) -> Path:
        """Write JSON (``.json``) or Markdown (``.md``) atomically; return the path.

        Raises ConfigError for another suffix or a missing folder.
        """
        return self.write_set([path])[0]

    def write_set(self, paths: Sequence[str | os.PathLike]) -> list[Path]:
        """Write every path of ``paths`` (each ``.json`` or ``.md``) as one set: a reader finds all
        of them old or all of them new (:func:`distcheck.core.outputs.write_files`); return them.

        Raises ConfigError for another suffix or a missing folder (nothing written)."""
        from distcheck.core.errors import ConfigError
        from distcheck.core.outputs import write_files

        files: dict[str | os.PathLike, bytes] = {}
        for given in paths:
            path = Path(given)
            if path.suffix.lower() not in (".json", ".md"):
                raise ConfigError("certificate", str(path), "must end in .json or .md")
            if not path.parent.is_dir():
                raise ConfigError("certificate", str(path), f"names a folder that does not exist ({path.parent})")
            files[path] = (self.to_json() if path.suffix.lower() == ".json" else self.to_markdown()).encode("utf-8")
        write_files(files)
        return [Path(p) for p in files]


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``;
    the temporary file never outlives the call."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # the permissions of a plain new file, not mkstemp's 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def stable_view(data: Any) -> Any:
    """A certificate's JSON data without the fields that change between identical runs (``created``,
    ``seconds``, ``stacks``): two runs of the same command must give equal stable views."""
    if isinstance(data, dict):
        return {k: stable_view(v) for k, v in data.items() if k not in VOLATILE}
    if isinstance(data, list):
        return [stable_view(v) for v in data]
    return data
