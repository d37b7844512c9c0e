"""DeepSpeed's ZeRO model-state memory estimators (memory-estimator contract).

Targets: ``estimate_zero2_model_states_mem_needs`` (``deepspeed/runtime/zero/stage_1_and_2.py``)
and ``estimate_zero3_model_states_mem_needs`` (``deepspeed/runtime/zero/stage3.py``), GPU
bytes without offload, N = ``num_gpus_per_node`` on one node; ZeRO-3 takes the largest layer's
parameter count as an option (drawn in [1, P]). Their printed tables come from the ``*_all_cold``
functions (the ``*_all_live`` ones count a model's parameters and call them): the row without
offload is the printed figure checked.
"""

from __future__ import annotations

import contextlib
import io

from hypothesis import strategies as st

from distcheck.libs.estimators import Estimator, check_estimator, check_family
from distcheck.libs.targets import dist_version

DIST = "deepspeed"
TITLE = "DeepSpeed ZeRO-2 and ZeRO-3 model-state estimators"
CONTRACT = "memory estimator"


def _quiet_import() -> None:
    """Import DeepSpeed's ZeRO modules without the log line its accelerator detection prints to
    stdout (which would mix into ``distcheck libs --format markdown``)."""
    import logging

    with contextlib.redirect_stdout(io.StringIO()):
        import deepspeed.runtime.zero.stage3  # noqa: F401
        import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


def _zero2(p: int, n: int, o) -> int:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    return estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=n, num_nodes=1, cpu_offload=False)[1]


def _zero3(p: int, n: int, o) -> int:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    return estimate_zero3_model_states_mem_needs(p, o["largest_layer_params"], num_gpus_per_node=n, num_nodes=1,
                                                 cpu_offload=False, cpu_offload_params=False, zero_init=True)[1]


def _printed_row(text: str, ending: str) -> str:
    for line in text.splitlines():
        if line.rstrip().endswith(ending):
            return line.split("|")[1].strip()
    raise ValueError(f"no printed row ends with {ending!r}: {text!r}")


def _zero2_printed(p: int, n: int, o) -> str:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        estimate_zero2_model_states_mem_needs_all_cold(p, num_gpus_per_node=n, num_nodes=1)
    return _printed_row(buf.getvalue(), "offload_optimizer=none")


def _zero3_printed(p: int, n: int, o) -> str:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        estimate_zero3_model_states_mem_needs_all_cold(p, o["largest_layer_params"], num_gpus_per_node=n, num_nodes=1)
    return _printed_row(buf.getvalue(), "offload_param=none, offload_optimizer=none, zero_init=1")


def _layer(p: int):
    return st.integers(1, p).map(lambda n: {"largest_layer_params": n})


def estimators() -> list[Estimator]:
    _quiet_import()
    lib = f"{DIST} {dist_version(DIST)}"
    return [
        Estimator("deepspeed.zero2", lib, 2, _zero2, printed=_zero2_printed),
        Estimator("deepspeed.zero3", lib, 3, _zero3, options=_layer, fit_options={"largest_layer_params": 1},
                  printed=_zero3_printed),
    ]


def rows(max_examples: int, seed: int):
    ests = estimators()
    out = []
    for est in ests:
        out += check_estimator(est, max_examples=max_examples, seed=seed)
    return out + check_family("deepspeed.zero", ests, max_examples=max_examples, seed=seed)
