"""accelerate's training-memory estimate (memory-estimator contract).

Target: ``accelerate estimate-memory``'s "Training using Adam" column. The command loads
a model on the meta device, sums its fp32 bytes (4 P) and calls
``accelerate.commands.estimate.estimate_training_usage(bytes, dtype)``, which returns the
components ``model``, ``gradients``, ``optimizer`` and ``step``; the column prints their
maximum with ``accelerate.utils.convert_bytes``. The adapter makes the same calls for
P parameters (no model download) at the dtypes with a training figure, float32 and float16.
It does not depend on N (no data parallelism: stage 0).
"""

from __future__ import annotations

from distcheck.libs.estimators import Estimator, check_estimator
from distcheck.libs.targets import dist_version

DIST = "accelerate"
TITLE = "accelerate estimate-memory, training with Adam"
CONTRACT = "memory estimator"
DTYPES = ("float32", "float16")


def _components(dtype: str):
    def components(p: int, n: int, o) -> dict:
        from accelerate.commands.estimate import estimate_training_usage

        c = estimate_training_usage(4 * p, dtype)
        return {"weights": c["model"], "grads": c["gradients"], "optimizer": c["optimizer"], "step": c["step"]}
    return components


def _total(dtype: str):
    def total(p: int, n: int, o) -> int:
        from accelerate.commands.estimate import estimate_training_usage

        return max(estimate_training_usage(4 * p, dtype).values())  # the column estimate_command prints
    return total


def _printed(dtype: str):
    def printed(p: int, n: int, o) -> str:
        from accelerate.utils import convert_bytes

        return convert_bytes(_total(dtype)(p, n, o))
    return printed


def estimators() -> list[Estimator]:
    lib = f"{DIST} {dist_version(DIST)}"
    return [Estimator(f"accelerate.{d}", lib, 0, _total(d), components=_components(d), printed=_printed(d),
                      depends_on_n=False) for d in DTYPES]


def rows(max_examples: int, seed: int):
    out = []
    for est in estimators():
        out += check_estimator(est, max_examples=max_examples, seed=seed)
    return out
