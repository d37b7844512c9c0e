"""Certify real libraries: memory estimators and rank layouts of DeepSpeed, accelerate, Megatron-core, torchtitan.

Two contracts, each usable on any target, and adapters for four libraries:

- :mod:`distcheck.libs.estimators`: a memory estimator (P, N, options -> bytes per GPU) is
  fitted to a·P + b·P/N + c over Hypothesis-drawn configurations; the convention that
  reproduces it is named (K, fp32 gradients, fp32 weights, the maximum of the components);
  its consistency is checked (one baseline at N = 1, monotone in N and in the stage,
  truncation under a byte, printed units).
- :mod:`distcheck.libs.layouts`: a rank layout (config -> groups of each axis, or of several
  axes) is compared with distcheck's layout for the same order
  (:mod:`distcheck.layout`, :mod:`distcheck.mesh_layout`); :mod:`distcheck.libs.badinput`
  records how the target handles bad input, plain and under ``python -O``.
- :mod:`distcheck.libs.targets`: the adapters (the libraries are imported lazily; install
  them with ``pip install 'distcheck[libs]'``).

:func:`run_libs` runs the targets and returns :class:`distcheck.report.CheckResult` rows,
with the recorded upstream discrepancies (:mod:`distcheck.libs.findings`) labelled
``finding``; :func:`distcheck.libs.table.summary_rows` folds them into one row per target,
the README's table "What distcheck finds in real libraries". ``distcheck libs`` is the
command (:mod:`distcheck.libs.cli`).
"""

from __future__ import annotations

from distcheck.errors import check_nonnegative_int, check_positive_int
from distcheck.report import FAIL, SKIP, CheckResult

__all__ = ["run_libs", "TARGET_NAMES"]

TARGET_NAMES = ("deepspeed", "accelerate", "megatron", "torchtitan")


def run_libs(targets=None, *, max_examples: int = 60, seed: int = 0, require_installed: bool = False) -> list[CheckResult]:
    """The contract rows of ``targets`` (default: all of :data:`TARGET_NAMES`), findings labelled.

    A target whose library is not installed gives one ``skip`` row naming the install command,
    or a ``FAIL`` row with ``require_installed`` (so that a CI job cannot pass having checked
    nothing). Raises ConfigError for an unknown target name or bad counts.
    """
    from distcheck.libs.findings import label
    from distcheck.libs.targets import dist_version, target
    from distcheck.validate import check_choice

    names = tuple(TARGET_NAMES if targets is None else targets)
    for name in names:
        check_choice("target", name, TARGET_NAMES)
    check_positive_int("max_examples", max_examples)
    check_nonnegative_int("seed", seed)
    rows: list[CheckResult] = []
    for name in names:
        mod = target(name)
        if dist_version(mod.DIST) is None:
            why = f"{mod.DIST} is not installed (pip install 'distcheck[libs]')"
            rows.append(CheckResult(check=f"libs.{name}", backend="-", verdict=FAIL if require_installed else SKIP,
                                    detail=why, extra={"target": name}))
            continue
        for row in mod.rows(max_examples, seed):
            row.extra.setdefault("target", name)
            rows.append(row)
    return label(rows)
