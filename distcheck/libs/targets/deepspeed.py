"""DeepSpeed's ZeRO model-state memory estimators (memory-estimator contracts).

Targets: ``estimate_zero2_model_states_mem_needs`` (``deepspeed/runtime/zero/stage_1_and_2.py``)
and ``estimate_zero3_model_states_mem_needs`` (``deepspeed/runtime/zero/stage3.py``), GPU
bytes without offload, N = ``num_gpus_per_node`` on one node; ZeRO-3 takes the largest layer's
parameter count as an option (drawn in [1, P]). Their printed tables come from the ``*_all_cold``
functions (the ``*_all_live`` ones count a model's parameters and call them): the row without
offload is the printed figure checked.

    distcheck certify distcheck.libs.targets.deepspeed:ZERO2 --contract memory-estimator
    distcheck certify distcheck.libs.targets.deepspeed:STAGES --contract memory-estimator-stages
"""

from __future__ import annotations

import contextlib
import io

from distcheck.parallel.memory.estimators import Estimator, EstimatorFamily

__all__ = ["DIST", "TITLE", "CERTIFY", "ZERO2", "ZERO3", "STAGES"]

DIST = "deepspeed"
TITLE = "DeepSpeed ZeRO-2 and ZeRO-3 model-state estimators"


def _zero_modules():
    """DeepSpeed's ZeRO modules, imported without the log line its accelerator detection prints to
    stdout (which would mix into ``distcheck libs --format markdown``)."""
    import logging
    import sys

    if "deepspeed.runtime.zero.stage3" not in sys.modules:
        with contextlib.redirect_stdout(io.StringIO()):
            import deepspeed.runtime.zero.stage3
            import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    return sys.modules["deepspeed.runtime.zero.stage_1_and_2"], sys.modules["deepspeed.runtime.zero.stage3"]


def _zero2(p: int, n: int, o) -> int:
    z2, _ = _zero_modules()
    return z2.estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=n, num_nodes=1, cpu_offload=False)[1]


def _zero3(p: int, n: int, o) -> int:
    _, z3 = _zero_modules()
    return z3.estimate_zero3_model_states_mem_needs(p, o["largest_layer_params"], num_gpus_per_node=n, num_nodes=1,
                                                    cpu_offload=False, cpu_offload_params=False, zero_init=True)[1]


def _printed_row(text: str, ending: str) -> str:
    for line in text.splitlines():
        if line.rstrip().endswith(ending):
            return line.split("|")[1].strip()
    raise ValueError(f"no printed row ends with {ending!r}: {text!r}")


def _zero2_printed(p: int, n: int, o) -> str:
    z2, _ = _zero_modules()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        z2.estimate_zero2_model_states_mem_needs_all_cold(p, num_gpus_per_node=n, num_nodes=1)
    return _printed_row(buf.getvalue(), "offload_optimizer=none")


def _zero3_printed(p: int, n: int, o) -> str:
    _, z3 = _zero_modules()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        z3.estimate_zero3_model_states_mem_needs_all_cold(p, o["largest_layer_params"], num_gpus_per_node=n,
                                                          num_nodes=1)
    return _printed_row(buf.getvalue(), "offload_param=none, offload_optimizer=none, zero_init=1")


def _largest_layer(p: int):
    from hypothesis import strategies as st

    return st.integers(1, p).map(_layer_options)


def _layer_options(n: int) -> dict:
    return {"largest_layer_params": n}


ZERO2 = Estimator("deepspeed.zero2", DIST, 2, _zero2, printed=_zero2_printed)
ZERO3 = Estimator("deepspeed.zero3", DIST, 3, _zero3, options=_largest_layer, fit_options={"largest_layer_params": 1},
                  printed=_zero3_printed)
STAGES = EstimatorFamily("deepspeed.zero", (ZERO2, ZERO3))

#: the targets of this module and the contract each is certified under
CERTIFY = (("ZERO2", "memory-estimator"), ("ZERO3", "memory-estimator"), ("STAGES", "memory-estimator-stages"))
