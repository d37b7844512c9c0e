"""Recorded discrepancies in the real libraries (findings), in the format of :mod:`distcheck.runners.findings`.

Each record names the one check it belongs to (a row of :func:`distcheck.libs.run_libs`,
``libs.<target>.<property>``), its exact symptom (a regular expression that must match the
FAIL row's whole detail), the versions it was seen on and a command that reproduces it.
:func:`label` turns matching FAIL rows into ``finding`` rows; a FAIL with another detail
stays FAIL, and a pass of a recorded check says the record no longer reproduces.
``distcheck certify`` knows no findings: certifying one of these targets alone FAILs the
property, as it should.
"""

from __future__ import annotations

import re

from distcheck.core.results import CheckResult
from distcheck.runners.findings import Finding, label_findings

__all__ = ["LIB_FINDINGS", "label", "versions"]

_DS_SEEN = ("0.19.8",)
_ACC_SEEN = ("1.15.0", "1.16.0")
_MEG_SEEN = ("0.16.1",)
_TT_SEEN = ("0.3.0",)
_DS_UNIT = ("DeepSpeed's estimate_zero{stage}_model_states_mem_needs_all_cold (and _all_live) prints "
            "gpu_mem / 2**30 labelled 'GB': GiB printed as GB (GB = 1e9 bytes); smallest visible case found: "
            "see the row")
_NOT_REPORTED = "not found in the library's issue tracker; recorded in docs/LIBRARIES.md and the README"
_BYTES_UNIT = r"(?:KiB printed as KB|MiB printed as MB|GiB printed as GB|TiB printed as TB)"


_ACC_GA_SEEN = ("1.16.0",)
#: the shrunk case of the training-step contract under accelerate's DDP (every world of 2 ranks is dp_replicate=2)
_GA_CASE = r"StepCase\(dp_replicate=2, dp_shard=1, tp=1, pp=1, m=[1-3], clip (?:binds|free); .+?; seed=\d+\)"
#: both ranks agree with each other (DDP's all-reduce ran) and differ from the token-mean step
_FLOAT = r"[-+.\deE]+"
_GA_DIFFER = (rf": ranks \[0, 1\] differ from the reference; rank 0(?: at index \([\d, ]+\))?: "
              rf"expected {_FLOAT}, got {_FLOAT}, error {_FLOAT} > bound {_FLOAT}(?: \(and \d+ more of \d+ checks\))?"
              # where it starts, when the failure is explained: the loss's gradient w.r.t. the model's output (the
              # per-micro-batch mean scales it), before any parallel layer
              rf"(?:; first divergence: gradient of the loss w\.r\.t\. the output of the model, step [1-3], "
              rf"micro-batch \d+, ranks 0-1: error {_FLOAT} > bound {_FLOAT} \(at index \([\d, ]+\): "
              rf"expected {_FLOAT}, got {_FLOAT}\); \d+ recorded tensors matched before it)?")
_GA_SUMMARY = ("accelerate's basic gradient-accumulation loop under DDP (Accelerator.accumulate, a mean-reduced "
               "cross_entropy per micro-batch, Accelerator.backward dividing by gradient_accumulation_steps, DDP "
               "averaging the ranks) weighs a token of a micro-batch with n_k tokens 1/(dp m n_k) instead of 1/T: the "
               "mean of per-micro-batch and per-rank means, wrong whenever token counts differ; smallest case: "
               "dp_replicate=2, m=1, 1 and 2 tokens on the two ranks. The token-weighted loop of accelerate's own "
               "guide (GA_TOKEN_SUM) is certified")
_GA_REPRODUCE = ("distcheck certify distcheck.libs.targets.accelerate:GA_MEAN_LOSS --contract training-step "
                 "--world-sizes {world_size} --backend gloo   # and GA_TOKEN_SUM, the guide's fix: certified")
_GA_REPORTED = ("documented upstream: accelerate's guide 'Performing gradient accumulation with Accelerate', section "
                "'Gradient accumulation on training samples of variable size' (the Hugging Face blog 'Fixing Gradient "
                "Accumulation', October 2024); the basic loop of the guide's first sections and of "
                "Accelerator.accumulate's docstring is unchanged")


def _exact(text: str) -> str:
    return re.escape(text)


LIB_FINDINGS: tuple[Finding, ...] = (
    Finding(
        name="deepspeed.zero2.gib_printed_as_gb",
        check="libs.deepspeed.zero2.printed_unit",
        symptom=(r"P=[1-9]\d*, N=[1-9]\d*: \d+ bytes printed as '\d+\.\d\dGB', which is bytes / 2\*\*30: "
                 r"GiB printed as GB \(GB = 1e9 bytes gives \d+\.\d\d GB\)"),
        summary=_DS_UNIT.format(stage=2),
        library="deepspeed", seen_on=_DS_SEEN,
        reproduce=("python -c \"from deepspeed.runtime.zero.stage_1_and_2 import "
                   "estimate_zero2_model_states_mem_needs_all_cold as f; f(10**9, 8)\"   # per GPU 3.96GB: "
                   "4,250,000,000 bytes = 4.25 GB = 3.96 GiB; or: distcheck certify "
                   "distcheck.libs.targets.deepspeed:ZERO2 --contract memory-estimator"),
        reported=_NOT_REPORTED,
    ),
    Finding(
        name="deepspeed.zero3.gib_printed_as_gb",
        check="libs.deepspeed.zero3.printed_unit",
        symptom=(r"P=[1-9]\d*, N=[1-9]\d*, largest_layer_params=[1-9]\d*: \d+ bytes printed as '\d+\.\d\dGB', "
                 r"which is bytes / 2\*\*30: GiB printed as GB \(GB = 1e9 bytes gives \d+\.\d\d GB\)"),
        summary=_DS_UNIT.format(stage=3),
        library="deepspeed", seen_on=_DS_SEEN,
        reproduce=("python -c \"from deepspeed.runtime.zero.stage3 import "
                   "estimate_zero3_model_states_mem_needs_all_cold as f; f(10**9, 10**7, 8)\"   # 2.13GB: "
                   "2,290,000,000 bytes = 2.29 GB = 2.13 GiB; or: distcheck certify "
                   "distcheck.libs.targets.deepspeed:ZERO3 --contract memory-estimator"),
        reported=_NOT_REPORTED,
    ),
    Finding(
        name="deepspeed.zero.baseline_differs",
        check="libs.deepspeed.zero.baseline_n1",
        symptom=(r"P=[1-9]\d*, N=1, largest_layer_params=[1-9]\d*: nothing is sharded, yet the stages differ: "
                 r"deepspeed\.zero2 \d+ bytes \(= 20·P\), deepspeed\.zero3 \d+ bytes \(= 18·P \+ \d+\)"),
        summary=("with one GPU (N = 1, nothing sharded) DeepSpeed's ZeRO-2 estimator counts 20 B/param "
                 "(2 + 18: 16-bit weights, 16-bit and fp32 gradients, fp32 master, Adam m and v) and its ZeRO-3 "
                 "estimator 18 B/param (plus 4 B per parameter of the largest layer): the two count the model "
                 "state differently (K = 16 against K = 14 in the ZeRO paper's form); smallest case P = 1"),
        library="deepspeed", seen_on=_DS_SEEN,
        reproduce=("python -c \"from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs "
                   "as z2; from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3; "
                   "print(z2(10**6, 1, 1, False)[1], z3(10**6, 1, 1, 1, False, False)[1])\"   # 20000000 18000004"),
        reported=_NOT_REPORTED,
    ),
    Finding(
        name="deepspeed.zero.stage3_above_stage2",
        check="libs.deepspeed.zero.stage_order",
        symptom=(r"P=[1-9]\d*, N=[1-9]\d*, largest_layer_params=[1-9]\d*: stage 3 \(deepspeed\.zero3\) needs \d+ "
                 r"bytes, more than stage 2 \(deepspeed\.zero2\), \d+"),
        summary=("DeepSpeed's ZeRO-3 estimate (4 x largest layer + 18 P/N) exceeds its ZeRO-2 estimate (2 P + 18 P/N) "
                 "whenever the largest layer holds more than half of the parameters; smallest case P = 1, largest "
                 "layer 1, N = 1: 22 bytes against 20"),
        library="deepspeed", seen_on=_DS_SEEN,
        reproduce=("python -c \"from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs "
                   "as z2; from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3; "
                   "print(z2(1, 1, 1, False)[1], z3(1, 1, 1, 1, False, False)[1])\"   # 20 22"),
        reported=_NOT_REPORTED,
    ),
    *(Finding(
        name=f"accelerate.{dtype}.binary_units_printed_as_decimal",
        check=f"libs.accelerate.{dtype}.printed_unit",
        symptom=(r"P=[1-9]\d*, N=1: \d+ bytes printed as '\d+(?:\.\d+)? (?:KB|MB|GB|TB)', which is "
                 rf"bytes / 2\*\*(?:10|20|30|40): {_BYTES_UNIT} \((?:KB|MB|GB|TB) = 1e(?:3|6|9|12) bytes gives "
                 r"\d+\.\d\d (?:KB|MB|GB|TB)\)"),
        summary=("accelerate.utils.convert_bytes, which prints every figure of `accelerate estimate-memory`, divides "
                 "by 1024 per step and labels the result KB, MB, GB, TB: binary units printed as decimal ones "
                 "(convert_bytes(10**9) is '953.67 MB')"),
        library="accelerate", seen_on=_ACC_SEEN,
        reproduce="python -c \"from accelerate.utils import convert_bytes; print(convert_bytes(10**9))\"   # 953.67 MB",
        reported=_NOT_REPORTED,
    ) for dtype in ("float32", "float16")),
    Finding(
        name="accelerate.float16.maximum_not_sum",
        check="libs.accelerate.float16.fit",
        symptom=_exact("bytes per GPU = 8·P + 0·P/N: 8 B/param replicated, 0 B/param sharded over N at ZeRO stage 0; "
                       "no documented convention reproduces it; the total is the maximum of its components (weights 4, "
                       "grads 6, optimizer 8, step 8 B/param), not their sum (26); weights, gradients and optimizer "
                       "state together are 18 B/param"),
        summary=("accelerate's mixed-precision training estimate ('Training using Adam', float16) is the maximum of "
                 "its own components (model 4, gradients 6, optimizer 8, step 8 B/param), 8 B/param, although the "
                 "weights, gradients and Adam states it lists are held together (18 B/param): it is below every "
                 "documented convention (12 to 20 B/param); smallest case P = 1: 8 bytes"),
        library="accelerate", seen_on=_ACC_SEEN,
        reproduce=("python -c \"from accelerate.commands.estimate import estimate_training_usage as f; "
                   "c = f(4, 'float16'); print(c, max(c.values()))\"   # P = 1: max 8 bytes, components 4 + 6 + 8"),
        reported=_NOT_REPORTED,
    ),
    Finding(
        name="accelerate.training_usage.unknown_dtype_accepted",
        check="libs.accelerate.training_usage.refused",
        symptom=_exact("python accepts dtype 'fp16' (an alias it does not know) -> {'model': -1, 'optimizer': -1, "
                       "'gradients': -1, 'step': -1}; dtype 'int8' -> {'model': -1, 'optimizer': -1, 'gradients': -1, "
                       "'step': -1}"),
        summary=("accelerate's estimate_training_usage(bytes, mixed_precision) raises nothing for a dtype string it "
                 "does not know ('fp16', 'int8'): it returns -1 for every part (model, optimizer, gradients, step), "
                 "while a valid dtype ('float16', accepted first) gives positive figures"),
        library="accelerate", seen_on=_ACC_SEEN,
        reproduce=("python -c \"from accelerate.commands.estimate import estimate_training_usage as f; "
                   "print(f(4000, 'float16')); print(f(4000, 'fp16'))\"   # model 4000, optimizer 8000, "
                   "gradients 6000, step 8000; then -1 for every part"),
        reported=_NOT_REPORTED,
    ),
    *(Finding(
        name=f"accelerate.ga_mean_loss.{prop}",
        check=f"libs.accelerate.ga_mean_loss.{prop}",
        symptom=_GA_CASE + r": step [1-3] " + what + _GA_DIFFER,
        summary=_GA_SUMMARY, library="accelerate", seen_on=_ACC_GA_SEEN, reproduce=_GA_REPRODUCE, reported=_GA_REPORTED,
    ) for prop, what in (
        ("params", r"(?:AdamW exp_avg(?:_sq)? of )?[\w.]+"),
        ("loss", r"reported loss \(global token mean\)"),
        ("grad_norm", r"reported grad norm"),
        ("clipping", r"clipping factor \(reference norm [-+.\deE]+\)"),
    )),
    Finding(
        name="megatron.rank_generator.bad_input_accepted",
        check="libs.megatron.rank_generator.refused",
        symptom=_exact("python accepts tp=0 -> []; tp=-1 -> []; dp=-2 -> []; order 'tp-tp-dp' (repeated axis) -> "
                       "[[0, 4], [1, 5]] | python -O accepts ep=2 with cp=2 -> [[0, 2], [1, 3], [4, 6], [5, 7]]"),
        summary=("Megatron-core's RankGenerator accepts zero and negative sizes (no groups at all), a repeated axis "
                 "in its order string (groups naming ranks 4 and 5 of a 4-rank world), and its only check, that ep "
                 "and cp are not both > 1, is an assert that vanishes under python -O"),
        library="megatron-core", seen_on=_MEG_SEEN,
        reproduce=("python -c \"from megatron.core.parallel_state import RankGenerator as R; "
                   "print(R(tp=2, ep=1, dp=2, pp=1, cp=1, order='tp-tp-dp').get_ranks('dp'))\"   # [[0, 4], [1, 5]]"),
        reported=_NOT_REPORTED,
    ),
    Finding(
        name="torchtitan.parallel_dims.asserts_vanish",
        check="libs.torchtitan.parallel_dims.refused",
        symptom=_exact("python accepts ep=3 not dividing dp_shard*cp*tp=2 -> 3 | "
                       "python -O accepts dp_replicate=0 -> 0; tp=-2 -> -2; dp_shard=3 in a world of 4 -> 3; "
                       "dp_shard=-1 with tp=3 in a world of 4 -> 1; "
                       "dp_shard=-2 -> 4"),
        summary=("torchtitan's ParallelDims validates with assert only: under python -O it accepts zero and negative "
                 "degrees, degrees whose product is not the world size, and dp_shard=-2 (read as -1); an ep that "
                 "does not divide the dp_shard*cp*tp ranks it borrows is accepted even without -O"),
        library="torchtitan", seen_on=_TT_SEEN,
        reproduce=("python -O -c \"from torchtitan.distributed.parallel_dims import ParallelDims as P; "
                   "print(P(dp_replicate=1, dp_shard=3, cp=1, tp=1, pp=1, ep=1, world_size=4).dp_shard)\"   # 3"),
        reported=_NOT_REPORTED,
    ),
)


def versions() -> dict[str, str]:
    """The installed version of every library a record names ("not installed" when absent)."""
    from distcheck.libs.targets import dist_version

    return {lib: dist_version(lib) or "not installed" for lib in sorted({f.library for f in LIB_FINDINGS})}


def label(rows: list[CheckResult]) -> list[CheckResult]:
    """``rows`` with every FAIL a record explains labelled ``finding``
    (:func:`distcheck.runners.findings.label_findings`)."""
    return label_findings(rows, LIB_FINDINGS, versions=versions())
