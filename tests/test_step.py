"""The training-step package (distcheck/parallel/step/): references and closed forms, the reductions'
properties and their mutants, the tiny decoder, and the ``training-step`` contract on torch's FSDP2 x TP
composition (examples/my_step.py) and on the wrong steps of examples/step_mutants.py."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from distcheck.closed_form import get
from distcheck.core.errors import ConfigError
from distcheck.engine.mutants import kill_mutant, registry
from distcheck.engine.registry import get as get_property
from distcheck.engine.runner import run_property
from distcheck.parallel.step import reference as ref

STEP_PROPERTIES = ("step.loss.token_mean", "step.grad_norm.global", "step.grads.dp_scale",
                   "step.grads.norm_weight_tp", "step.clip.scale", "step.tokens.total")


def test_import_is_light():
    code = ("import sys, distcheck.parallel.step as s; assert 'torch' not in sys.modules and 'numpy' not in "
            "sys.modules; print(set(s.__all__) <= set(dir(s)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"


def test_token_mean_is_not_the_mean_of_means():
    losses = [[np.array([1.0, 0.0]), np.array([3.0, 5.0])]]
    masks = [[np.array([True, False]), np.array([True, True])]]
    assert ref.token_mean_loss(losses, masks) == 3.0  # (1 + 3 + 5) / 3
    from distcheck.parallel.step.mutants import mean_of_microbatch_means

    assert mean_of_microbatch_means(losses, masks) == 2.5  # (1 + 4) / 2
    with pytest.raises(ConfigError, match="at least one token"):
        ref.token_mean_loss([[np.zeros(2)]], [[np.zeros(2, dtype=bool)]])


def test_sharded_norm_counts_replicas_once():
    lay = ref.StepLayout(dp_replicate=2, dp_shard=2, tp=2, pp=1)
    grads = [np.arange(8.0).reshape(4, 2), np.array([[3.0, 4.0]])]
    placements = [ref.Placement(tp_dim=0), ref.Placement(tp_dim=None)]
    shards = [[ref.local_shard(g, p, lay, r) for g, p in zip(grads, placements, strict=True)]
              for r in range(lay.world_size)]
    assert ref.sharded_grad_norm(shards, placements, lay) == ref.global_grad_norm(grads)
    assert get("step.grad_norm.copies").evaluate(dp_replicate=2, tp=2, tp_sharded=0) == 4


def test_clip_scale_and_form():
    assert ref.clip_scale(0.5, 1.0) == 1.0
    assert ref.clip_scale(3.0, 1.0) == 1.0 / (3.0 + 1e-6)
    assert get("step.clip.scale").evaluate(norm=3, max_norm=1) == Fraction(10**6, 3 * 10**6 + 1)
    with pytest.raises(ConfigError, match="norm"):
        ref.clip_scale(-1.0, 1.0)
    with pytest.raises(ConfigError, match="max_norm"):
        ref.clip_scale(1.0, 0.0)


def test_layout_validated_and_printed():
    assert str(ref.StepLayout(dp_shard=2)) == "dp_replicate=1, dp_shard=2, tp=1, pp=1"
    with pytest.raises(ConfigError, match="tp"):
        ref.StepLayout(tp=0)
    from distcheck.parallel.step.contracts import layouts, parse_layout

    assert parse_layout("dp_shard=2,tp=2") == ref.StepLayout(dp_shard=2, tp=2)
    with pytest.raises(ConfigError, match="axis 'sp'"):
        parse_layout("sp=2")
    assert {str(lay) for lay in layouts(2)} == {"dp_replicate=1, dp_shard=2, tp=1, pp=1",
                                               "dp_replicate=2, dp_shard=1, tp=1, pp=1",
                                               "dp_replicate=1, dp_shard=1, tp=2, pp=1",
                                               "dp_replicate=1, dp_shard=1, tp=1, pp=2",
                                               "dp_replicate=1, dp_shard=1, tp=1, pp=1, cp=2",
                                               "dp_replicate=1, dp_shard=2, tp=1, pp=1, ep=2 (torchtitan)",
                                               "dp_replicate=1, dp_shard=2, tp=1, pp=1, ep=2 (megatron)",
                                               "dp_replicate=2, dp_shard=1, tp=1, pp=1, ep=2 (megatron)",
                                               "dp_replicate=1, dp_shard=1, tp=1, pp=1, cp=2, ep=2 (torchtitan)",
                                               "dp_replicate=1, dp_shard=1, tp=1, pp=1, cp=2, ep=2 (megatron)"}
    assert parse_layout("pp=2,dp_shard=2") == ref.StepLayout(dp_shard=2, pp=2)
    assert ref.StepLayout(tp=2, pp=2) in layouts(4)  # pipeline stages under the tensor-parallel plan
    assert ref.StepLayout(dp_shard=2, tp=2, pp=2) in layouts(8) and ref.StepLayout(tp=4, pp=2) in layouts(8)


def test_pipeline_stages_split_the_decoder():
    from distcheck.parallel.step.model import TinyConfig, build_model, pipeline_stage, stage_of

    cfg = TinyConfig(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=2, ffn_dim=4, vocab_size=8, tied=False)
    names = [n for n, _ in build_model(cfg).named_parameters()]
    for stage in (0, 1):
        held = {n for n, _ in pipeline_stage(build_model(cfg), stage, 2).named_parameters()}
        assert held == {n for n in names if stage_of(n, 2, 2) == stage}
    assert stage_of("tok_embeddings.weight", 2, 2) == 0 and stage_of("output.weight", 2, 2) == 1
    with pytest.raises(ConfigError, match="n_layers"):
        pipeline_stage(build_model(replace(cfg, n_layers=3)), 0, 2)


def test_a_tied_head_under_pp_is_two_copies_on_the_first_and_last_stage():
    # Megatron-LM's shared embedding: the embedding on the first stage, a copy of it as the head on the last
    import torch

    from distcheck.parallel.step.model import TinyConfig, build_model, pipeline_stage, stages_of

    cfg = TinyConfig(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=2, ffn_dim=4, vocab_size=8, tied=True)
    weights = {n: p.detach().numpy().copy() for n, p in build_model(cfg).named_parameters()}
    first, last = (dict(pipeline_stage(build_model(cfg, weights), s, 2).named_parameters()) for s in (0, 1))
    assert "tok_embeddings.weight" in first and "output.weight" not in first
    assert "output.weight" in last and "tok_embeddings.weight" not in last
    assert torch.equal(first["tok_embeddings.weight"], last["output.weight"])
    assert stages_of("tok_embeddings.weight", cfg, 2) == {0, 1}
    assert stages_of("tok_embeddings.weight", replace(cfg, tied=False), 2) == {0}
    assert stages_of("tok_embeddings.weight", cfg, 1) == {0}


@pytest.mark.parametrize("name", ["proof.step.dp_bytes", "proof.step.tp_bytes",
                                  "proof.step.token_weight_equal_microbatches"])
def test_proofs(name):
    from distcheck.engine.proofs import prove

    assert prove(name).verdict == "pass", prove(name).detail


def test_a_wrong_dp_form_is_not_proved(monkeypatch):
    # the proof fails on a step whose FSDP2 all-gathers once (2 collectives, ZeRO-2's count), not 3
    import dataclasses

    from distcheck.engine.proofs import prove
    from distcheck.parallel.step import proofs

    form = get("step.comm_bytes_per_rank.dp")
    s = form.symbols
    wrong = dataclasses.replace(form, expr=s["m"] * 2 * (s["dp_shard"] - 1) / s["dp_shard"] * s["params"]
                                * s["bytes_per_element"])
    monkeypatch.setattr(proofs, "get", lambda name: wrong if name == form.name else get(name))
    assert prove("proof.step.dp_bytes").verdict == "FAIL"


@pytest.mark.parametrize("name", STEP_PROPERTIES)
def test_property_holds(name):
    assert run_property(get_property(name), "ci").verdict == "pass"


@pytest.mark.parametrize("name", sorted(n for n in registry() if n.startswith("step.")))
def test_mutant_killed_naming_the_composition(name):
    row = kill_mutant(name, "ci")
    assert row.extra["outcome"] == "killed", row.detail
    assert "dp_replicate=" in row.detail and "dp_shard=" in row.detail and "tp=" in row.detail


def test_every_step_property_has_a_mutant():
    killed = {m.kills for n, m in registry().items() if n.startswith("step.")}
    assert killed == set(STEP_PROPERTIES)


def test_contract_declares_its_smallest_world_and_degenerate_layouts():
    from distcheck.certify import get_contract

    c = get_contract("training-step")
    assert c.min_world_size == 2
    assert "below 2" in c.cannot_fail(1, c.parse_options({}))
    assert "one device" in c.cannot_fail(2, c.parse_options({"layout": "tp=1"}))
    assert "needs 4 ranks" in c.cannot_fail(2, c.parse_options({"layout": "dp_shard=2,tp=2"}))
    assert c.cannot_fail(4, c.parse_options({"layout": "dp_shard=2,tp=2"})) is None


def test_axes_restrict_the_layouts_drawn_and_pinned():
    # a StepTarget's axes (a DDP loop: dp_replicate only) become the axes option; other axes are never drawn, a
    # pinned layout outside them is refused, and a world with no such layout is a skip with the reason
    from hypothesis import find

    from distcheck.certify import get_contract
    from distcheck.core.errors import ConfigError
    from distcheck.engine.contracts.errors import ProtocolError
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.plans import DDP_STEP, ddp, ddp_no_sync

    c = get_contract("training-step")
    _, opts = c.resolve(DDP_STEP, "distcheck.parallel.step.plans:DDP_STEP", c.parse_options({}))
    assert opts["axes"] == "dp_replicate"
    for ws in (2, 4):
        drawn = c.cases(ws, "float64", opts)
        assert find(drawn, lambda case: True).layout == ref.StepLayout(dp_replicate=ws)
    with pytest.raises(ConfigError, match="outside the axes dp_replicate"):
        c.resolve(DDP_STEP, None, c.parse_options({"layout": "dp_shard=2"}))
    with pytest.raises(ConfigError, match="parallelizes only dp_replicate, not tp"):
        c.resolve(DDP_STEP, None, c.parse_options({"axes": "dp_replicate,tp"}))
    with pytest.raises(ConfigError, match="axis 'dp' must be one of"):
        c.resolve(ddp, None, c.parse_options({"axes": "dp"}))
    with pytest.raises(ProtocolError, match="replaces accumulate, which the pipeline schedule does not call"):
        c.resolve(StepTarget(ddp, accumulate=ddp_no_sync), None, c.parse_options({}))
    with pytest.raises(ProtocolError, match="accumulate hook of a StepTarget must take 2 positional arguments"):
        c.resolve(StepTarget(ddp, accumulate=lambda model: None, axes=("dp_replicate",)), None, c.parse_options({}))
    with pytest.raises(ConfigError, match="names no axis"):
        c.resolve(ddp, None, c.parse_options({"axes": ","}))
    with pytest.raises(ConfigError, match="names an axis twice"):
        c.resolve(ddp, None, c.parse_options({"axes": "tp,tp"}))
    with pytest.raises(ConfigError, match="sets dp_replicate twice"):
        c.resolve(ddp, None, c.parse_options({"layout": "dp_replicate=2,dp_replicate=1"}))
    for axes in (None, 3, "dp_replicate", ("dp_replicate", "dp_replicate")):
        with pytest.raises(ProtocolError, match="StepTarget axes"):
            c.resolve(StepTarget(ddp, axes=axes), None, c.parse_options({}))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="accumulate hook of a StepTarget must be callable, not 5"):
        c.resolve(StepTarget(ddp, accumulate=5, axes=("dp_replicate",)), None, c.parse_options({}))
    # the option may narrow the draw to leave pp out for a target with the default axes
    _, narrowed = c.resolve(StepTarget(ddp, accumulate=ddp_no_sync), None, c.parse_options({"axes": "dp_replicate"}))
    assert narrowed["axes"] == "dp_replicate"
    _, tp_only = c.resolve(ddp, None, c.parse_options({"axes": "tp"}))
    assert "no layout of 3 ranks has only the axes tp above 1" in c.cannot_fail(3, tp_only)
    assert c.cannot_fail(2, tp_only) is None and c.cases(3, "float64", tp_only) is None


def test_world_of_eight_is_drawn_under_thorough_only():
    # the budget: worlds of at most 4 ranks under dev and ci, 8 under thorough; nothing runs here
    from types import SimpleNamespace

    from hypothesis import find

    from distcheck.certify import certify, get_contract

    c = get_contract("training-step")
    assert c.beyond_profile(4, "ci") is None and c.beyond_profile(8, "thorough") is None
    assert "above 4" in c.beyond_profile(8, "ci") and "8 under thorough" in c.beyond_profile(8, "dev")
    eight = c.cases(8, "float64", c.parse_options({}))
    for want in (ref.StepLayout(dp_replicate=2, dp_shard=2, tp=2), ref.StepLayout(dp_shard=2, tp=4),
                 ref.StepLayout(dp_shard=4, pp=2)):
        assert find(eight, lambda case, want=want: case.layout == want).layout.world_size == 8
    assert {lay.world_size for lay in ref_layouts(8)} == {8} and len(ref_layouts(8)) > len(ref_layouts(4))

    def never(*args, **kwargs):
        raise AssertionError("a world of 8 must not run under ci")

    cert = certify("examples.my_step:parallelize", "training-step", world=SimpleNamespace(
        world_size=8, backend="gloo", run=never), profile="ci", examples=1)
    assert {v.verdict for v in cert.verdicts} == {"skip"} and all("thorough" in v.failure for v in cert.verdicts)


def ref_layouts(world_size):
    from distcheck.parallel.step.contracts import layouts

    return layouts(world_size)


def test_counterexample_names_every_axis():
    from distcheck.parallel.step.case import BINDING_MAX_NORM, StepCase
    from distcheck.parallel.step.model import TinyConfig

    cfg = TinyConfig(dim=8, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=2, ffn_dim=8, vocab_size=8, tied=True)
    case = StepCase(ref.StepLayout(dp_shard=2), cfg, 1, 1, 2, ((((1,),), ((2,),)),) * 2, BINDING_MAX_NORM, 0.01, 0)
    assert repr(case).startswith("StepCase(dp_replicate=1, dp_shard=2, tp=1, pp=1, m=1, clip binds;")


def test_composition_names_layout_schedule_microbatches_steps_and_clipping():
    from distcheck.certify import get_contract
    from distcheck.parallel.step.case import BINDING_MAX_NORM, FREE_MAX_NORM, StepCase
    from distcheck.parallel.step.model import TinyConfig

    cfg = TinyConfig(dim=8, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=2, ffn_dim=8, vocab_size=8, tied=False)
    c = get_contract("training-step")
    lengths = ((((1,), (2,)),) * 2,) * 3
    case = StepCase(ref.StepLayout(dp_shard=2, tp=2), cfg, 2, 1, 2, lengths, BINDING_MAX_NORM, 0.01, 0)
    assert c.composition(case) == {"layout": "dp_shard=2, tp=2", "schedule": "-", "micro-batches (GA steps)": "2",
                                   "steps": "3", "clip": "binds", "model": "dense"}
    piped = StepCase(ref.StepLayout(pp=2), cfg, 2, 1, 2, ((((1,), (2,)),),) * 2, FREE_MAX_NORM, 0.01, 0, "1f1b")
    assert c.composition(piped) == {"layout": "pp=2", "schedule": "1f1b", "micro-batches (GA steps)": "2",
                                    "steps": "2", "clip": "free", "model": "dense"}


def test_step_rows_join_the_layers_stage_and_skip_at_one_rank():
    # distcheck check's layers stage certifies torch's composition (plans.fsdp2_tp) at EXAMPLES examples; at one
    # rank every property is a skip row with the contract's reason, and nothing runs on the world
    from types import SimpleNamespace

    from distcheck.certify.runs import contract_rows
    from distcheck.parallel.step import checks
    from distcheck.stages import discover_checks

    assert "step" in [c.name for stage, c in discover_checks() if stage == "layers"]
    assert [r.max_examples for r in checks.CERTIFY] == [checks.EXAMPLES] and checks.EXAMPLES <= 3

    def never(*args, **kwargs):
        raise AssertionError("one rank must not run an example")

    rows = contract_rows(SimpleNamespace(world_size=1, backend="gloo", run=never), checks.CERTIFY)
    assert [r.check for r in rows] == [f"step.torch_fsdp2_tp.{p}" for p in
                                       ("params", "loss", "grad_norm", "clipping", "tokens")]
    assert {r.verdict for r in rows} == {"skip"} and all("one rank is one device" in r.detail for r in rows)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_step_rows_on_two_ranks(gloo2):
    # the rows distcheck check prints at two ranks: every property passes on torch's composition
    from distcheck.certify.runs import contract_rows
    from distcheck.parallel.step import checks

    rows = contract_rows(gloo2, checks.CERTIFY)
    assert [(r.verdict, r.examples) for r in rows] == [("pass", checks.EXAMPLES)] * 5, [r.detail for r in rows]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_torch_composition_certified():
    from distcheck.certify import certify

    cert = certify("examples.my_step:parallelize", "training-step", world_sizes=[2], examples=3, timeout_s=300)
    cert.assert_certified()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_ddp_accumulation_loop_certified():
    # DDP over the world, no_sync() before the last micro-batch: the accumulate hook is entered around every
    # micro-batch (its mutant, no_sync on the last one too, fails params in TORCH_MUTANTS)
    from distcheck.certify import certify

    cert = certify("distcheck.parallel.step.plans:DDP_STEP", "training-step", world_sizes=[2], examples=3,
                   timeout_s=300)
    cert.assert_certified()
    assert {r.columns["layout"] for r in cert.compositions} == {"dp_replicate=2"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_torch_composition_certified_under_pp_and_tp():
    # pp = 2 x tp = 2 at world size 4: each stage (no embedding on the last, no norm or head on the first) under
    # torchtitan's tensor-parallel plan, through torch.distributed.pipelining; clipping's norm summed over pp
    from distcheck.certify import certify

    cert = certify("examples.my_step:parallelize", "training-step", world_sizes=[4], examples=2,
                   options={"layout": "pp=2,tp=2"}, timeout_s=300)
    cert.assert_certified()
    assert {r.columns["layout"] for r in cert.compositions} == {"tp=2, pp=2"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cancelling_compositions_hold_to_the_bound(monkeypatch):
    # every sequence keeps one token and clipping binds: a softmax over one key leaves the query and key
    # projections' gradients exactly 0 in exact arithmetic, which the reference rounds to 0 and the
    # tensor-parallel ranks do not (the documented line at 4 ranks failed there: "expected 0, got -1.08e-21,
    # bound 0"); torch's composition must hold to the bound on every layout of 4 ranks, tp = 4 included
    from distcheck.certify import certify
    from distcheck.parallel.step import contracts as sc
    from distcheck.parallel.step.case import BINDING_MAX_NORM

    def cancelling(self, world_size, dtype, options):
        return sc._cases(sc.allowed(world_size, options), one_token=True, max_norms=(BINDING_MAX_NORM,))

    monkeypatch.setattr(sc.TrainingStep, "cases", cancelling)
    cert = certify("examples.my_step:parallelize", "training-step", world_sizes=[4], examples=16, timeout_s=600)
    cert.assert_certified()
    assert "tp=4" in {r.columns["layout"] for r in cert.compositions}
    assert {r.columns["clip"] for r in cert.compositions} == {"binds"}


#: each torch mutant, the property it must fail, a layout on two ranks where it shows, and the start of the first
#: divergence its recorded replay names
TORCH_MUTANTS = [
    ("LOCAL_SHARD_NORM", "grad_norm", "dp_shard=2", "the grad norm the clipping hook returned"),
    ("TP_REPLICATED_TP_TIMES", "grad_norm", "tp=2", "the grad norm the clipping hook returned"),
    ("MEAN_OF_MEANS", "params", "dp_shard=2", "gradient of the loss w.r.t. the output of the model"),
    ("WORLD_SIZE_SCALE", "grad_norm", "tp=2", "gradient of the loss w.r.t. the output of the model"),
    ("NORM_GRADS_NOT_SUMMED", "params", "tp=2", "reduced grad of layers.0.attention_norm.weight"),
    ("LOSS_OF_OWN_SHARD", "loss", "dp_replicate=2", "the reported loss"),
    ("TOKENS_OVER_WORLD", "tokens", "tp=2", "the reported tokens"),
    ("CLIP_WITHOUT_CLAMP", "clipping", "dp_shard=2", "clipped grad of"),
    ("STAGE_LOCAL_NORM", "grad_norm", "pp=2", "the grad norm the clipping hook returned"),
    ("NO_SYNC_EVERY_MICRO_BATCH", "params", "dp_replicate=2", "reduced grad of"),
]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(("target", "prop", "layout", "diverges"), TORCH_MUTANTS)
def test_torch_mutant_fails_naming_the_composition(target, prop, layout, diverges):
    from distcheck.certify import certify

    cert = certify(f"examples.step_mutants:{target}", "training-step", world_sizes=[2], examples=10,
                   options={"layout": layout}, timeout_s=300)
    verdict = next(v for v in cert.verdicts if v.property == prop)
    assert verdict.verdict == "FAIL", verdict
    assert verdict.counterexample.startswith("StepCase(dp_replicate="), verdict.counterexample
    # the certificate's "Compositions drawn" table: the pinned layout only, the property failing on one of them
    assert cert.compositions and {r.columns["layout"] for r in cert.compositions} == {layout.replace(",", ", ")}
    assert any(r.verdicts[prop] == "FAIL" for r in cert.compositions), cert.compositions
    # the failure's recorded replay names the first tensor that leaves its bound
    assert f"; first divergence: {diverges}" in verdict.failure, verdict.failure
    # the shrunk case fails on the bug, not on rounding: its first failing value is far outside the bound
    import re

    for error, bound in re.findall(r"error ([0-9.e+-]+) > bound ([0-9.e+-]+)", verdict.failure):
        assert float(bound) > 0 and float(error) > 2**10 * float(bound), verdict.failure


def _worked_example() -> str:
    """The python block of docs/CERTIFY.md's training-step section that a torchtitan user adapts."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "CERTIFY.md").read_text()
    after = text.split("A worked example a torchtitan user adapts", 1)[1]
    return after.split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"


def test_worked_example_is_short_and_imports_public_paths_only():
    import ast
    import importlib

    code = _worked_example()
    assert len(code.strip().splitlines()) <= 30
    tree = ast.parse(code)
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert modules
    for module in modules:  # torch's documented modules (no private component), or distcheck's public faces
        assert module.split(".")[0] in ("torch", "distcheck") and not any(p.startswith("_") for p in module.split("."))
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            mod = importlib.import_module(n.module)
            public = getattr(mod, "__all__", None)
            for alias in n.names:
                assert not alias.name.startswith("_") and (public is None or alias.name in public), alias.name
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert fn.name == "parallelize" and [a.arg for a in fn.args.args] == ["model", "mesh", "layout"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_worked_example_is_certified(tmp_path, monkeypatch):
    # the docs' block itself, as a user's module, certified under tensor parallelism on two ranks
    import os

    from distcheck.certify import certify

    (tmp_path / "worked_step.py").write_text(_worked_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    cert = certify("worked_step:parallelize", "training-step", world_sizes=[2], examples=2,
                   options={"layout": "tp=2"}, timeout_s=300)
    cert.assert_certified()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_speed_benchmark_prints_one_table():
    # benchmarks/bench_step.py at its smallest: the table's shape only (no timed assertion)
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_step.py"), "--examples", "1"], cwd=root,
                         capture_output=True, text=True, timeout=900, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert rows[0] == "| side | examples | seconds | examples/s | ratio to by hand |"
    assert rows[1] == "|---|---|---|---|---|"
    assert [r.split(" | ")[0] for r in rows[2:]] == ["| distcheck certify (warm gloo pool)",
                                                    "| distcheck certify, bfloat16 (FSDP2 MixedPrecisionPolicy)",
                                                    "| by hand (plain torch, one world)"]
    assert all(r.split(" | ")[1] == "1" and r.endswith("x |") for r in rows[2:])
    assert rows[4].endswith("| 1.00x |") and "world size 4" in out
    assert re.search(r"^bfloat16 over float64 certification: [0-9.]+x the examples per second$", out, re.M), out


def test_tied_pp_option_draws_a_tied_head_under_pp_only():
    from hypothesis import find
    from hypothesis.errors import NoSuchExample

    from distcheck.parallel.step.contracts import TrainingStep

    c = TrainingStep()
    tied = c.cases(2, "float64", {"layout": "pp=2", "tied_pp": True})
    assert find(tied, lambda case: True).config.tied
    with pytest.raises(NoSuchExample):  # never untied under the option
        find(tied, lambda case: not case.config.tied)
    with pytest.raises(NoSuchExample):  # never tied under pp without it
        find(c.cases(2, "float64", {"layout": "pp=2"}), lambda case: case.config.tied)
    assert find(c.cases(2, "float64", {"layout": "tp=2", "tied_pp": True}), lambda case: not case.config.tied)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(("layout", "world_size"), [("pp=2", 2), ("dp_shard=2,pp=2", 4), ("tp=2,pp=2", 4)])
def test_tied_head_under_pp_certified_with_the_embedding_group_all_reduce(layout, world_size):
    # Megatron-LM's shared embedding: the first stage's embedding and the last stage's head are two copies, their
    # gradients summed over the two stages (finalize_grads) and the weight counted once in the norm
    from distcheck.certify import certify

    cert = certify("distcheck.parallel.step.plans:TIED_PIPELINE_STEP", "training-step", world_sizes=[world_size],
                   examples=3, options={"layout": layout, "tied_pp": True}, timeout_s=300)
    cert.assert_certified()
    assert {r.columns["layout"] for r in cert.compositions} == {layout.replace(",", ", ")}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_tied_head_under_pp_without_the_all_reduce_fails_params():
    # uw-syfi/piper#13: the two copies' gradients never summed, each stage steps its copy on its own half
    from distcheck.certify import certify

    cert = certify("zoo.piper_13_pp_tied_embedding_not_reduced:BUG", "training-step", world_sizes=[2], examples=4,
                   options={"layout": "pp=2", "tied_pp": True}, timeout_s=300)
    verdict = next(v for v in cert.verdicts if v.property == "params")
    assert verdict.verdict == "FAIL", verdict
    assert "pp=2" in verdict.counterexample and "tied head" in verdict.counterexample, verdict.counterexample
    assert "step 1 " in verdict.failure and "tok_embeddings.weight" in verdict.failure, verdict.failure
    assert "tied head's two copies on two pipeline stages" in verdict.failure, verdict.failure
