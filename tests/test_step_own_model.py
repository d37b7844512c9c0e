"""The ``training-step`` contract on the user's own model: a ``StepTarget`` with a model factory, the ``batch``
and ``loss`` hooks, the same weights on every rank and in the reference, pp left out without the target's own
``pipeline`` hook and certified with it, bad hooks refused, and the
GPT-2-style example (examples/my_gpt.py) certified while its wrong plans (examples/gpt_mutants.py) fail."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent


def _contract():
    from distcheck.certify import get_contract

    return get_contract("training-step")


def _fsdp(model, mesh, layout):
    return model


@dataclass(frozen=True)
class _Config:
    vocab_size: int = 16
    block_size: int = 8


def _case(layout=None, config=None, seq_len=4, lengths=None, m=2, seed=3):
    from distcheck.parallel.step.case import FREE_MAX_NORM, StepCase
    from distcheck.parallel.step.model import TinyConfig
    from distcheck.parallel.step.reference import StepLayout

    layout = layout or StepLayout(dp_shard=2)
    config = config or TinyConfig(dim=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=2, ffn_dim=8, vocab_size=8,
                                  tied=True)
    lengths = lengths or ((((1,), (4,)), ((3,), (2,))),) * 2
    return StepCase(layout, config, m, 1, seq_len, lengths, FREE_MAX_NORM, 2.0**-4, seed)


# ------------------------------------------------------------------ the factory: one set of weights


def test_factory_builds_the_same_float64_weights_whatever_ran_before():
    from distcheck.parallel.step.harness import build_target_model
    from examples.my_gpt import CONFIG, GPT

    torch.manual_seed(123)
    a = build_target_model(GPT, CONFIG, 7).state_dict()
    torch.randn(1000)  # the global generator moved on: the build must not depend on it
    state = torch.random.get_rng_state()
    b = build_target_model(GPT, CONFIG, 7).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's generator is left as it was
    assert torch.get_default_dtype() == torch.float32  # the default dtype restored
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {v.dtype for v in a.values()} == {torch.float64} and {v.device.type for v in a.values()} == {"cpu"}
    c = build_target_model(GPT, CONFIG, 8).state_dict()
    assert not torch.equal(a["wte.weight"], c["wte.weight"])  # the seed is the case's


class _ComplexCache(torch.nn.Module):
    """A float32 weight and a complex RoPE-style cache (torchtitan's ComplexRoPE keeps one)."""

    def __init__(self, cfg: object) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2, dtype=torch.float32))
        self.register_buffer("cache", torch.polar(torch.ones(3), torch.arange(3.0)), persistent=False)


def test_factory_casts_floating_tensors_and_keeps_a_complex_buffer():
    # Module.to(float64) would cast the complex cache to a real one, dropping its imaginary part
    from distcheck.parallel.step.harness import build_target_model

    m = build_target_model(_ComplexCache, None, 0)
    assert m.w.dtype == torch.float64
    assert m.cache.dtype == torch.complex128  # built under float64, the default dtype of the build
    want = torch.polar(torch.ones(3, dtype=torch.float64), torch.arange(3.0, dtype=torch.float64))
    assert torch.equal(m.cache, want) and m.cache.imag.abs().max() > 0.9


def test_the_ranks_and_the_reference_cast_a_complex_buffer_nowhere():
    # the ranks cast the factory's model to the case's master dtype and the reference's start to its own: both
    # through floating_to, which leaves a complex buffer complex (Module.to(dtype) made torchtitan's RoPE cache real
    # on both sides alike, so the step still certified, with a RoPE that was not torchtitan's)
    from distcheck.parallel.step.harness import build_target_model, start_model
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.precision import floating_to

    m = floating_to(build_target_model(_ComplexCache, None, 0), torch.float32)
    assert m.w.dtype == torch.float32 and m.cache.dtype == torch.complex128 and m.cache.imag.abs().max() > 0.9
    target = StepTarget(lambda model, mesh, layout: model, model=_ComplexCache)
    case = type("Case", (), {"config": None, "seed": 0})()
    ref = start_model(case, target, None, "float64", "float64")
    assert ref.cache.dtype == torch.complex128 and ref.cache.imag.abs().max() > 0.9


def test_factory_returning_no_module_is_a_protocol_error():
    from distcheck.engine.contracts.errors import ProtocolError
    from distcheck.parallel.step.harness import build_target_model

    with pytest.raises(ProtocolError, match="must return a torch.nn.Module, not dict"):
        build_target_model(lambda cfg: {}, None, 0)


def test_reference_loads_rank0s_initial_weights():
    # the reference is the same factory, loaded with rank 0's initial state_dict: a factory that draws from its
    # own generator (not the seed) still starts the reference where rank 0 started
    from distcheck.parallel.step.case import batch
    from distcheck.parallel.step.harness import build_target_model, reference_step, same_weights
    from distcheck.parallel.step.hooks import StepTarget
    from tests.step_targets import pid_seeded

    case = _case()
    initial = same_weights(build_target_model(pid_seeded, case.config, case.seed))  # no process group: as built
    other = {k: v + 1 for k, v in initial.items()}
    tokens, labels = (torch.from_numpy(a) for a in batch(case))
    target = StepTarget(_fsdp, model=pid_seeded)
    mine = reference_step(case, tokens, labels, target=target, initial=initial)
    theirs = reference_step(case, tokens, labels, target=target, initial=other)
    assert mine[0]["loss"] != theirs[0]["loss"]
    again = reference_step(case, tokens, labels, target=target, initial=initial)
    assert all(np.array_equal(mine[-1]["params"][k], again[-1]["params"][k]) for k in mine[-1]["params"])


# ------------------------------------------------------------------ the batch and loss hooks


def test_a_model_returning_its_own_loss_gives_the_reference_of_the_plain_model():
    # LMWithLoss computes its own per-micro-batch mean; with the labels passed as a keyword (batch hook) and the
    # sum given back (loss hook: mean x tokens), the reference step is the plain tiny Llama's, value for value
    from distcheck.parallel.step.case import batch
    from distcheck.parallel.step.harness import build_target_model, reference_step
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.model import build_model
    from tests.step_targets import OWN_LOSS, LMWithLoss

    case = _case()
    tokens, labels = (torch.from_numpy(a) for a in batch(case))
    initial = build_target_model(LMWithLoss, case.config, case.seed).state_dict()
    own = reference_step(case, tokens, labels, target=OWN_LOSS, initial=initial)
    plain_initial = {k.removeprefix("lm."): v for k, v in initial.items()}
    plain = reference_step(case, tokens, labels, target=StepTarget(_fsdp, model=build_model),
                           initial=plain_initial)
    for o, p in zip(own, plain, strict=True):
        assert o["tokens"] == p["tokens"] == sum(sum(sum(mb) for mb in rank) for rank in case.lengths[0])
        assert o["loss"] == pytest.approx(p["loss"], rel=1e-14) and o["norm"] == pytest.approx(p["norm"], rel=1e-13)
        assert {k.removeprefix("lm."): v for k, v in o["params"].items()}.keys() == p["params"].keys()
        for k, v in o["params"].items():
            np.testing.assert_allclose(v, p["params"][k.removeprefix("lm.")], rtol=1e-12, atol=1e-14)


def test_default_loss_fn_weighs_the_loss_hooks_sum():
    # token_mean_loss is the target's loss hook (info.token_loss) times dp / global tokens: 2 x 3 / 12 = 0.5
    from distcheck.parallel.step.hooks import StepInfo, token_mean_loss
    from distcheck.parallel.step.reference import StepLayout

    info = StepInfo(StepLayout(dp_shard=3), None, 12, 4, 2, 1.0, 0, lambda out, labels, info: out["loss"] * 2)
    assert float(token_mean_loss({"loss": torch.tensor(3.0)}, None, info)) == 1.5
    logits = torch.zeros(1, 2, 4, dtype=torch.float64)
    plain = StepInfo(StepLayout(dp_shard=3), None, 12, 4, 2, 1.0)
    assert float(token_mean_loss(logits, torch.tensor([[1, -100]]), plain)) == pytest.approx(np.log(4) * 3 / 12)


def test_call_model_passes_dicts_as_keywords_and_tuples_as_arguments():
    from distcheck.parallel.step.hooks import call_model

    def seen(*args, **kwargs):
        return args, kwargs

    assert call_model(seen, {"input_ids": 1, "labels": 2}) == ((), {"input_ids": 1, "labels": 2})
    assert call_model(seen, (1, 2)) == ((1, 2), {})
    assert call_model(seen, [1, 2]) == (([1, 2],), {})


# ------------------------------------------------------------------ the contract's side: config, axes, hooks refused


def test_a_user_config_fixes_the_vocabulary_and_caps_the_sequences():
    from hypothesis import find

    from distcheck.parallel.step.case import batch
    from examples.my_gpt import CONFIG, TARGET

    c = _contract()
    spec, opts = c.resolve(TARGET, "examples.my_gpt:TARGET", c.parse_options({}))
    assert opts["axes"] == "dp_replicate,dp_shard,tp"  # pp left out of a user model's axes
    case = find(c.cases_for(spec, 4, "float64", opts), lambda case: case.layout.tp == 4)
    assert case.config is CONFIG and repr(case).endswith(f"; model config {CONFIG!r}; seed={case.seed})")
    tokens, labels = batch(case)
    assert tokens.max() < CONFIG.vocab_size and labels.max() < CONFIG.vocab_size
    assert find(c.cases_for(spec, 4, "float64", opts), lambda case: case.seq_len == 8).seq_len == 8
    from tests.step_targets import SHORT

    short, sopts = c.resolve(SHORT, "tests.step_targets:SHORT", c.parse_options({}))
    lens = [find(c.cases_for(short, 4, "float64", sopts), lambda case, tp=tp: case.layout.tp == tp).seq_len
            for tp in (1, 2, 4)]
    assert max(lens) <= 4 and lens[-1] == 4
    assert find(c.cases_for(short, 2, "float64", sopts), lambda case: True).config.vocab_size == 5


def test_the_drawn_sizes_go_to_a_factory_without_a_config():
    from hypothesis import find

    from distcheck.engine.contracts.targets import make_target
    from distcheck.parallel.step.model import TinyConfig
    from tests.step_targets import OWN_LOSS

    c = _contract()
    spec, opts = c.resolve(OWN_LOSS, "tests.step_targets:OWN_LOSS", c.parse_options({}))
    assert opts["axes"] == "dp_replicate,dp_shard"
    assert spec == make_target(OWN_LOSS, "tests.step_targets:OWN_LOSS", "hooks")
    case = find(c.cases_for(spec, 2, "float64", opts), lambda case: True)
    assert isinstance(case.config, TinyConfig) and case.layout.pp == 1


def _refused(target, match, options=None, error=None):
    from distcheck.engine.contracts.errors import ProtocolError

    c = _contract()
    with pytest.raises(error or ProtocolError, match=match) as info:
        c.resolve(target, "mine:TARGET", c.parse_options(options or {}))
    if error is None:
        assert "mine:TARGET" in str(info.value)  # names the target
    return info.value


def test_bad_model_hooks_are_refused_naming_the_target():
    from distcheck.core.errors import ConfigError
    from distcheck.parallel.step.hooks import StepTarget

    _refused(StepTarget(_fsdp, model=5), "the model hook of a StepTarget must be callable, not 5")  # type: ignore
    _refused(StepTarget(_fsdp, model=lambda: None), r"the model hook .* must take 1 positional arguments")
    _refused(StepTarget(_fsdp, batch=lambda tokens: tokens), r"the batch hook .* must take 3 positional arguments")
    _refused(StepTarget(_fsdp, loss="sum"), "the loss hook of a StepTarget must be callable, not 'sum'")  # type: ignore
    _refused(StepTarget(_fsdp, loss=lambda out, labels: out), r"the loss hook .* must take 3 positional arguments")
    _refused(StepTarget(_fsdp, config=_Config()), "config is given without a model factory")
    for cfg, what in ((object(), "vocab_size=None"), (_Config(vocab_size=0), "vocab_size=0"),
                      (_Config(vocab_size=True), "vocab_size=True")):
        _refused(StepTarget(_fsdp, model=lambda c: None, config=cfg), f"config.{what} must be a positive int")
    _refused(StepTarget(_fsdp, model=lambda c: None, config=_Config(block_size=3)),
             "config.block_size=3 must be an int >= 4")
    # a user model has no pipeline split: pp named in its axes, in the axes option or a pinned layout is refused
    own = StepTarget(_fsdp, model=lambda c: None)
    _refused(StepTarget(_fsdp, model=lambda c: None, axes=("dp_shard", "pp")), "name pp: a user model has no pipeline "
             "split")
    err = _refused(own, "not pp .*a user model has no pipeline split", {"axes": "dp_shard,pp"}, ConfigError)
    assert err.field == "option axes"
    _refused(own, "sets pp above 1, outside the axes dp_replicate, dp_shard, tp", {"layout": "pp=2"}, ConfigError)
    # and the batch and loss hooks are the micro-batch loop's: the tiny Llama with either leaves pp out too
    _refused(StepTarget(_fsdp, loss=lambda o, y, i: o), "replaces loss, which the pipeline schedule does not call")


def _split4(model, mesh, layout, info):
    return None, [model]


def _no_model(config):
    return None


def test_a_pipeline_hook_lets_a_user_model_draw_pp():
    from hypothesis import find

    from distcheck.core.errors import ConfigError
    from distcheck.parallel.step.hooks import StepTarget
    from tests.step_targets import STACK_PP

    c = _contract()
    # without the hook the refusal names it; with it pp is in the default axes and pinned layouts
    own = StepTarget(_fsdp, model=lambda c: None)
    _refused(own, r"unless it gives StepTarget\(pipeline=...\)", {"axes": "dp_shard,pp"}, ConfigError)
    _refused(own, r"sets pp above 1, outside the axes .*unless it gives StepTarget\(pipeline=...\)",
             {"layout": "pp=2"}, ConfigError)  # a pinned layout names the hook too
    split = StepTarget(_fsdp, model=_no_model, pipeline=_split4)
    _, opts = c.resolve(split, "mine:TARGET", c.parse_options({}))
    assert opts["axes"] == "dp_replicate,dp_shard,tp,pp"
    c.resolve(StepTarget(_fsdp, model=_no_model, pipeline=_split4, axes=("pp",)), "mine:T",
              c.parse_options({"layout": "pp=2"}))
    # its batch and loss hooks stay its own under pp (distcheck feeds the schedule from them); accumulate and
    # backward are still the micro-batch loop's
    assert STACK_PP.loop_hooks == ()
    spec, sopts = c.resolve(STACK_PP, "tests.step_targets:STACK_PP", c.parse_options({}))
    case = find(c.cases_for(spec, 2, "float64", sopts), lambda case: True)
    assert case.layout.pp == 2 and case.schedule in ("gpipe", "1f1b")
    _refused(StepTarget(_fsdp, model=lambda c: None, pipeline=_split4, backward=lambda loss, m, i: None),
             "replaces backward, which the pipeline schedule does not call")
    _refused(StepTarget(_fsdp, pipeline=lambda model, mesh, layout: None),
             r"the pipeline hook .* must take 4 positional arguments")


def _pp_case(schedule="1f1b"):
    from distcheck.parallel.step.reference import StepLayout
    from tests.step_targets import StackConfig

    return replace(_case(StepLayout(pp=2), StackConfig()), schedule=schedule)


class _Schedule:
    def step(self, *args, **kwargs):
        pass


def test_own_split_hands_the_hook_the_schedule_inputs_and_a_stage_loss_distcheck_counts():
    from types import SimpleNamespace

    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.pipeline import own_split

    seen = {}
    part = torch.nn.Linear(2, 2)

    def hook(model, mesh, layout, info):
        seen.update(model=model, layout=layout, info=info)
        return _Schedule(), [part]

    def loss_fn(out, labels, info):  # what is backpropagated: distcheck's token count in it
        return out.sum() * 0 + info.global_tokens * 1000 + info.microbatch_tokens

    def loss(out, labels, info):  # the token sum reported
        return out.sum()

    target = StepTarget(_fsdp, loss_fn=loss_fn, loss=loss, pipeline=hook)
    case, model = _pp_case(), torch.nn.Linear(3, 3)
    state = {"total": 7, "sums": [], "model": None}
    ctx = SimpleNamespace(rank=1, device=torch.device("cpu"))
    schedule, got = own_split(ctx, target, model, None, case, state)
    info = seen["info"]
    assert got is part and state["model"] is part and isinstance(schedule, _Schedule)
    assert seen["model"] is model and seen["layout"] == case.layout  # the whole model, not a stage
    assert (info.microbatches, info.microbatch_size, info.device, info.schedule) == (2, 1, ctx.device, "1f1b")
    out = torch.ones(1, 4, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, 2, -100, -100]])
    back = info.loss(out, labels)
    assert float(back.detach()) == 7 * 1000 + 2  # the target's loss_fn, with the step's and the micro-batch's tokens
    assert [float(v) for v in state["sums"]] == [12.0]  # the loss hook's sum, float64, detached
    assert state["sums"][0].dtype == torch.float64 and not state["sums"][0].requires_grad


def test_a_pipeline_hook_returning_other_than_one_part_is_a_protocol_error():
    from types import SimpleNamespace

    from distcheck.engine.contracts.errors import ProtocolError
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.pipeline import own_split

    ctx = SimpleNamespace(rank=0, device=torch.device("cpu"))
    parts = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    many = _Schedule()
    many._n_microbatches = 4  # the case's m is 2: a schedule of micro-batch size 1 (torchtitan's default)
    other, lossless = _Schedule(), _Schedule()
    other._stage = SimpleNamespace(submod=torch.nn.Linear(2, 2))  # a stage wrapping another module than the part
    lossless._loss_fn = None
    for ret, match in (((_Schedule(), parts), "returned 2 model parts on rank 0: .*not an interleaved schedule"),
                       ((_Schedule(), []), r"returned 0 model parts on rank 0: .*one pipeline stage per rank "
                                           r"\(GPipe, 1F1B\)$"),
                       (_Schedule(), r"must return \(schedule, model_parts\).*not _Schedule$"),
                       ((_Schedule(), [object()]), r"must return \(schedule, model_parts\).*not \(_Schedule, "
                                                   r"\[object\]\)"),
                       ((many, parts[:1]), r"schedule runs 4 micro-batches, the step 2 \(info.microbatches\)"),
                       ((other, parts[:1]), r"schedule runs another Linear than the one it returned as the part"),
                       ((lossless, parts[:1]), r"schedule has no loss_fn: build it with loss_fn=info.loss")):
        target = StepTarget(_fsdp, pipeline=lambda model, mesh, layout, info, ret=ret: ret)
        with pytest.raises(ProtocolError, match=match):
            own_split(ctx, target, torch.nn.Linear(2, 2), None, _pp_case(), {"total": 1, "sums": [], "model": None})


def test_a_rank_holding_a_parameter_the_reference_lacks_fails_params():
    # an untied copy of a tied weight: the reference lists the weight once, a rank lists a second name
    from distcheck.parallel.step.contracts import TrainingStep

    ok = TrainingStep._extra("step 1", {"wte.weight": 0}, [{"params": {"wte.weight": 0}}] * 2)
    assert ok.ok
    bad = TrainingStep._extra("step 1", {"wte.weight": 0}, [{"params": {"wte.weight": 0, "lm_head.weight": 0}}] * 2)
    assert not bad.ok and bad.ranks == (0, 1) and "lm_head.weight" in bad.message


# ------------------------------------------------------------------ the GPT example


def _glue(path: Path) -> list[str]:
    text = path.read_text()
    after = text.split("\n# --- glue", 1)[1].split("\n", 1)[1]
    return [line for line in after.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_gpt_example_has_at_most_ten_lines_of_glue_and_says_how_many():
    import examples.my_gpt as gpt

    text = (ROOT / "examples" / "my_gpt.py").read_text()
    glue = _glue(ROOT / "examples" / "my_gpt.py")
    said = re.search(r"the glue distcheck\s+needs: (\d+) lines", gpt.__doc__ or "")
    header = re.search(r"\n# --- glue: what distcheck needs \((\d+) lines\)", text)
    assert said and header and int(said.group(1)) == int(header.group(1)) == len(glue) <= 10, glue
    # the glue names distcheck; the model and the plan above it do not
    above = text.split("\n# --- glue", 1)[0].split('"""', 2)[2]
    assert "distcheck" not in above and any("distcheck" in line for line in glue)
    tree = ast.parse(text)
    names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert "TARGET" in names and gpt.TARGET.model is gpt.GPT and gpt.TARGET.config is gpt.CONFIG


def test_gpt_ties_its_head_and_lists_the_tie_once():
    from distcheck.parallel.step.harness import build_target_model
    from examples.my_gpt import CONFIG, GPT

    model = build_target_model(GPT, CONFIG, 0)
    names = [n for n, _ in model.named_parameters()]
    assert model.lm_head.weight is model.wte.weight and "wte.weight" in names and "lm_head.weight" not in names
    assert {"h.0.ln_1.bias", "ln_f.bias", "wpe.weight", "h.1.mlp.c_fc.bias"} <= set(names)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_gpt_example_certified_at_two_and_four_ranks():
    # docs/CONTRACTS.md's command (fewer examples): every layout of 2 and 4 ranks without pp, tp = 4 included
    out = subprocess.run([sys.executable, "-m", "distcheck", "certify", "examples.my_gpt:TARGET", "--contract",
                          "training-step", "--world-sizes", "2,4", "--examples", "4"], cwd=ROOT,
                         capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 failed" in out.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("target", ["TIED_HEAD_NOT_RETIED", "LAYERNORM_OFF_PLAN"])
def test_gpt_with_a_wrong_plan_fails_params(target):
    from distcheck.certify import certify

    cert = certify(f"examples.gpt_mutants:{target}", "training-step", world_sizes=[2], examples=3,
                   options={"layout": "tp=2"}, timeout_s=300)
    verdict = next(v for v in cert.verdicts if v.property == "params")
    assert verdict.verdict == "FAIL", verdict
    assert verdict.counterexample.startswith("StepCase(dp_replicate=1, dp_shard=1, tp=2, pp=1")
    assert "model config GPTConfig(" in verdict.counterexample
    if target == "TIED_HEAD_NOT_RETIED":
        assert "wte.weight" in verdict.failure
    else:
        assert ".ln_" in verdict.failure or "wte.weight" in verdict.failure


def _docs_example() -> str:
    """The python block that opens docs/CERTIFY.md's training-step section ("Bring your own model")."""
    text = (ROOT / "docs" / "CERTIFY.md").read_text()
    section = text.split("## The training-step contract", 1)[1]
    assert section.lstrip().startswith("**Bring your own model.**")
    return section.split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"


def test_docs_example_is_short_and_a_step_target(tmp_path, monkeypatch):
    import importlib

    code = _docs_example()
    assert len(code.strip().splitlines()) <= 30
    tree = ast.parse(code)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert fn.name == "parallelize" and [a.arg for a in fn.args.args] == ["model", "mesh", "layout"]
    (tmp_path / "docs_gpt.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("docs_gpt")
    from examples.my_gpt import GPT

    assert module.TARGET.model is GPT and module.TARGET.config.vocab_size == 32
    c = _contract()
    _, opts = c.resolve(module.TARGET, "docs_gpt:TARGET", c.parse_options({}))
    assert opts["axes"] == "dp_replicate,dp_shard,tp"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_docs_example_is_certified(tmp_path, monkeypatch):
    import os

    from distcheck.certify import certify

    (tmp_path / "docs_gpt.py").write_text(_docs_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cert = certify("docs_gpt:TARGET", "training-step", world_sizes=[2], examples=3, options={"layout": "tp=2"},
                   timeout_s=300)
    cert.assert_certified()


# ------------------------------------------------------------------ the hooks on a world


@pytest.mark.multiprocess
@pytest.mark.slow
def test_own_loss_model_certified_and_its_mean_of_means_fails(gloo2):
    from distcheck.certify import certify

    cert = certify("tests.step_targets:OWN_LOSS", "training-step", world=gloo2, examples=4,
                   options={"layout": "dp_shard=2"})
    cert.assert_certified()
    bad = certify("tests.step_targets:OWN_LOSS_MEAN_OF_MEANS", "training-step", world=gloo2, examples=10,
                  options={"layout": "dp_shard=2"})
    assert {v.property: v.verdict for v in bad.verdicts}["params"] == "FAIL"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_own_pipeline_split_certified_and_grads_averaged_over_microbatches_fail(gloo2):
    # a plain model under its own split (torch's PipelineStage, GPipe or 1F1B as drawn); the same split under torch's
    # default scale_grads=True divides the gradients by m once more: the first divergence is the first stage's
    # reduced gradient, its micro-batches' gradients matching
    from distcheck.certify import certify

    cert = certify("tests.step_targets:STACK_PP", "training-step", world=gloo2, examples=3,
                   options={"layout": "pp=2"})
    cert.assert_certified()
    assert {row.columns["schedule"] for row in cert.compositions} == {"gpipe", "1f1b"}
    bad = certify("tests.step_targets:STACK_PP_SCALED", "training-step", world=gloo2, examples=6,
                  options={"layout": "pp=2"})
    got = {v.property: v for v in bad.verdicts}
    assert got["params"].verdict == "FAIL" and got["grad_norm"].verdict == "FAIL", got
    assert got["loss"].verdict == "pass" and got["tokens"].verdict == "pass"
    assert "first divergence: reduced grad of tok_embeddings.weight (after every micro-batch" in got[
        "params"].failure, got


@pytest.mark.multiprocess
@pytest.mark.slow
def test_every_rank_starts_from_rank0s_weights(gloo2):
    # the factory draws from a generator seeded by the process id: without rank 0's weights broadcast, rank 1
    # would start apart from rank 0 and the reference, and params would fail
    from distcheck.certify import certify

    cert = certify("tests.step_targets:PID_SEEDED", "training-step", world=gloo2, examples=3,
                   options={"layout": "dp_replicate=2"})
    cert.assert_certified()


def test_pp_layouts_are_refused_on_the_threaded_backend_whose_groups_cannot_send():
    from types import SimpleNamespace

    from distcheck.engine.contracts.errors import ProtocolError
    from distcheck.parallel.step.harness import _pipeline_refused
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.reference import StepLayout

    with pytest.raises(ProtocolError, match="backend='threaded' cannot run pipeline stages.*--backend gloo"):
        _pipeline_refused(SimpleNamespace(backend="threaded"), StepTarget(_fsdp), StepLayout(pp=2))
    _pipeline_refused(SimpleNamespace(backend="gloo"), StepTarget(_fsdp), StepLayout(pp=2))  # runs


def test_a_pinned_pp4_layout_draws_1f1b_with_m_at_least_pp():
    # st.integers(pp, 3) raised InvalidArgument (min 4 > max 3) once 1F1B was drawn at pp = 4
    from hypothesis import given, settings

    from distcheck.parallel.step.contracts import _cases
    from distcheck.parallel.step.reference import StepLayout

    seen = set()

    @settings(max_examples=30, database=None, deadline=None)
    @given(_cases([StepLayout(pp=4)]))
    def draw(case):
        seen.add(case.schedule)
        assert case.microbatches >= (4 if case.schedule == "1f1b" else 1)

    draw()
    assert "1f1b" in seen


@pytest.mark.multiprocess
def test_a_tied_head_under_its_own_split_is_held_under_the_references_name(gloo2):
    # the last stage's copy of the tied weight is named output.weight there; recorded as tok_embeddings.weight (the
    # reference lists the tie once), it no longer fails params as "a parameter the reference does not have"
    from distcheck.certify import certify

    ok = certify("tests.step_targets:STACK_PP_TIED", "training-step", world=gloo2, examples=3,
                 options={"layout": "pp=2"})
    ok.assert_certified()
    bad = certify("tests.step_targets:STACK_PP_TIED_UNSUMMED", "training-step", world=gloo2, examples=3,
                  options={"layout": "pp=2"})
    got = {v.property: v for v in bad.verdicts}
    assert got["params"].verdict == "FAIL" and "tok_embeddings.weight" in got["params"].failure, got["params"]


def test_a_schedule_whose_loss_fn_skips_info_loss_is_a_protocol_error():
    # a loss_fn of the user's own that never calls info.loss: the step's loss would be read as 0
    from types import SimpleNamespace

    from distcheck.engine.contracts.errors import ProtocolError
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.pipeline import schedule_step

    case = _pp_case("gpipe")
    target = StepTarget(_fsdp, pipeline=lambda model, mesh, layout, info: None)
    tokens = torch.zeros((case.microbatches, case.micro_batch_size, case.seq_len), dtype=torch.long)
    last = SimpleNamespace(rank=1, device=torch.device("cpu"))  # pp coordinate 1 of 2
    with pytest.raises(ProtocolError, match="called info.loss 0 times for 2 micro-batches on the last stage"):
        schedule_step(last, target, _Schedule(), torch.nn.Linear(2, 2), None, case, tokens, tokens, 1,
                      {"total": 1, "sums": [], "model": None})
