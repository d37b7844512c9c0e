"""How a target handles bad input: zero or negative sizes, a repeated axis, checks that vanish under -O.

A :class:`Probe` is one call with bad input (a Python expression over the target's
API). :func:`check_bad_input` runs every probe twice in a fresh interpreter, once
plain and once under ``python -O`` (which removes ``assert`` statements), and
records for each whether the call was *refused* (it raised) or *accepted* (it
returned, and what). A target passes when it refuses every probe in both modes;
otherwise the row is FAIL and lists each accepted probe with what it returned,
mode by mode. Probes are data: an expression and the import line it needs, run by
``python -c`` with a timeout; nothing here imports the target.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from distcheck.errors import ConfigError
from distcheck.report import FAIL, PASS, CheckResult
from distcheck.validate import check_type

__all__ = ["Probe", "run_probes", "check_bad_input", "PROBE_TIMEOUT_S"]

#: seconds one interpreter may take to import the target and run every probe
PROBE_TIMEOUT_S = 180.0

_RUNNER = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import logging
logging.disable(logging.CRITICAL)
setup, probes = json.loads(sys.argv[1])
env = {}
exec(setup, env)
out = {}
for label, expr in probes:
    try:
        value = eval(expr, env)
        out[label] = ["accepted", repr(value)[:200]]
    except BaseException as exc:
        out[label] = ["refused", type(exc).__name__]
print("PROBES " + json.dumps(out))
"""


@dataclass(frozen=True)
class Probe:
    """One call with bad input: ``label`` (e.g. ``"tp=0"``) and the expression that makes it."""

    label: str
    expr: str


def run_probes(setup: str, probes: tuple[Probe, ...], *, optimize: bool, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """``{label: ("accepted", repr) | ("refused", exception type)}`` from a fresh interpreter
    (``python -O`` when ``optimize``). Raises ConfigError when the interpreter fails or times out."""
    check_type("setup", setup, str, "must be Python import lines")
    payload = json.dumps([setup, [[p.label, p.expr] for p in probes]])
    cmd = [sys.executable, *(["-O"] if optimize else []), "-c", _RUNNER, payload]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConfigError("timeout_s", timeout_s, "was not enough to import the target and run its probes") from None
    for line in done.stdout.splitlines():
        if line.startswith("PROBES "):
            return {k: tuple(v) for k, v in json.loads(line[7:]).items()}
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise ConfigError("setup", setup, f"failed in a fresh interpreter (exit {done.returncode}): {tail}")


def check_bad_input(name: str, library: str, setup: str, probes: tuple[Probe, ...], *,
                    timeout_s: float = PROBE_TIMEOUT_S) -> CheckResult:
    """The ``libs.<name>.bad_input`` row (module docstring)."""
    results = {mode: run_probes(setup, probes, optimize=mode == "python -O", timeout_s=timeout_s)
               for mode in ("python", "python -O")}
    parts = []
    for mode, out in results.items():
        accepted = [f"{p.label} -> {out[p.label][1]}" for p in probes if out[p.label][0] == "accepted"]
        if mode == "python -O":  # name only what -O newly lets through
            plain = results["python"]
            accepted = [a for p, a in zip([p for p in probes if out[p.label][0] == "accepted"], accepted)
                        if plain[p.label][0] == "refused"]
        if accepted:
            parts.append(f"{mode} accepts " + "; ".join(accepted))
    refusals = ", ".join(f"{p.label}: {results['python'][p.label][1]}" for p in probes
                         if results["python"][p.label][0] == "refused")
    extra = {"contract": "bad-input", "probes": {m: {k: list(v) for k, v in r.items()} for m, r in results.items()}}
    if parts:
        return CheckResult(check=f"libs.{name}.bad_input", backend=library, verdict=FAIL, examples=2 * len(probes),
                           detail=" | ".join(parts), extra=extra)
    return CheckResult(check=f"libs.{name}.bad_input", backend=library, verdict=PASS, examples=2 * len(probes),
                       detail=f"every bad input is refused, also under python -O ({refusals})", extra=extra)
