"""Plan a training run: which parallel layout fits a model on a set of GPUs, at what bubble and communication.

Pure arithmetic on distcheck's references and closed forms (no torch, no
matplotlib): :func:`resolve_model` names the model, :class:`Hardware` and
:class:`Workload` the run, :func:`estimate` sizes one :class:`Layout` and
:func:`plan` sizes every valid layout, ranks them and walks the lesson's
order of questions ("Choosing a strategy", the lesson "Scaling and
distributed training", section 5). The conventions are in
:mod:`distcheck.plan.estimate`.

    from distcheck.plan import Hardware, Workload, plan, resolve_model
    p = plan(resolve_model("lesson-70b-style"), Hardware(gpus=16, gpu_memory="80 GB"), Workload())
    p.smallest_split          # (8, 2, 68975329280): TP 8 x PP 2, 68.98 GB before activations
    p.recommended.layout      # Layout(tp=8, pp=2, dp=1, cp=1, zero=0)
"""

from distcheck.plan.estimate import Estimate, Hardware, Layout, Workload, check_layout, conventions, estimate
from distcheck.plan.inputs import COMPONENTS, LESSON_STEPS, RECOMPUTE, SCHEDULES
from distcheck.plan.model import ModelSpec, preset_names, resolve_model
from distcheck.plan.planner import (
    SORT_KEYS,
    Plan,
    Question,
    plan,
    rank_key,
    smallest_tp_pp_before_activations,
    sort_estimates,
    valid_layouts,
)

__all__ = [
    "COMPONENTS", "LESSON_STEPS", "RECOMPUTE", "SCHEDULES",
    "Estimate", "Hardware", "Layout", "Workload", "check_layout", "conventions", "estimate",
    "ModelSpec", "preset_names", "resolve_model",
    "Plan", "Question", "plan", "rank_key", "smallest_tp_pp_before_activations", "valid_layouts", "SORT_KEYS",
    "sort_estimates",
]
