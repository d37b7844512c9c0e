"""accelerate's training-memory estimate (memory-estimator contract).

Target: ``accelerate estimate-memory``'s "Training using Adam" column. The command loads
a model on the meta device, sums its fp32 bytes (4 P) and calls
``accelerate.commands.estimate.estimate_training_usage(bytes, dtype)``, which returns the
components ``model``, ``gradients``, ``optimizer`` and ``step``; the column prints their
maximum with ``accelerate.utils.convert_bytes``. The adapter makes the same calls for
P parameters (no model download) at the dtypes with a training figure, float32 and float16.
It does not depend on N (no data parallelism: stage 0).

``BAD_INPUT`` (bad-input contract) probes ``estimate_training_usage`` with dtype strings it
does not know. Its setup is the positive control: a valid dtype (float16) must be accepted
first, with every part positive, or the setup raises and the row FAILs (so that a changed
signature, refusing every call, cannot read as "refuses bad input").

    distcheck certify distcheck.libs.targets.accelerate:FLOAT16 --contract memory-estimator
    distcheck certify distcheck.libs.targets.accelerate:BAD_INPUT --contract bad-input
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from distcheck.parallel.layout.contracts import Probe, ProbeSet
from distcheck.parallel.memory.estimators import Estimator

__all__ = ["DIST", "TITLE", "CERTIFY", "FLOAT32", "FLOAT16", "BAD_INPUT"]

DIST = "accelerate"
TITLE = "accelerate estimate-memory, training with Adam"


def _components(dtype: str, p: int, n: int, o: Mapping[str, Any]) -> dict[str, int]:
    from accelerate.commands.estimate import estimate_training_usage

    c = estimate_training_usage(4 * p, dtype)
    return {"weights": c["model"], "grads": c["gradients"], "optimizer": c["optimizer"], "step": c["step"]}


def _total(dtype: str, p: int, n: int, o: Mapping[str, Any]) -> int:
    from accelerate.commands.estimate import estimate_training_usage

    return max(estimate_training_usage(4 * p, dtype).values())  # the column estimate_command prints


def _printed(dtype: str, p: int, n: int, o: Mapping[str, Any]) -> str:
    from accelerate.utils import convert_bytes

    return convert_bytes(_total(dtype, p, n, o))


def _estimator(dtype: str) -> Estimator:
    return Estimator(f"accelerate.{dtype}", DIST, 0, partial(_total, dtype), components=partial(_components, dtype),
                     printed=partial(_printed, dtype), depends_on_n=False)


FLOAT32 = _estimator("float32")
FLOAT16 = _estimator("float16")

#: the positive control, run before the probes: a valid dtype is accepted with every part positive
_VALID_FIRST = """from accelerate.commands.estimate import estimate_training_usage
_valid = estimate_training_usage(4000, 'float16')
if sorted(_valid) != ['gradients', 'model', 'optimizer', 'step'] or min(_valid.values()) <= 0:
    raise RuntimeError(f"positive control: estimate_training_usage(4000, 'float16') gave {_valid!r}")
"""
BAD_INPUT = ProbeSet("accelerate.training_usage", DIST, _VALID_FIRST, (
    Probe("dtype 'fp16' (an alias it does not know)", "estimate_training_usage(4000, 'fp16')"),
    Probe("dtype 'int8'", "estimate_training_usage(4000, 'int8')"),
), (Probe("dtype 'float16'", "estimate_training_usage(4000, 'float16')"),))

#: the targets of this module and the contract each is certified under
CERTIFY = (("FLOAT32", "memory-estimator"), ("FLOAT16", "memory-estimator"), ("BAD_INPUT", "bad-input"))
