"""Expert parallelism: the reference (backward by finite differences, capacity and dropping by hand), the
properties and their mutants (each killed by an edge case and by the generated search), the parameter counts
of Mixtral 8x7B and DeepSeek-V3, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from distcheck.core.errors import ConfigError
from distcheck.core.vocab import Router
from distcheck.engine.mutants import mutants
from distcheck.engine.registry import properties
from distcheck.parallel.ep import models
from distcheck.parallel.ep import reference as ref
from tests.package_checks import assert_mutant_killed, assert_property_holds

PROPERTIES = ["ep.layer.forward", "ep.layer.backward", "ep.tokens.conserved", "ep.aux_loss"]
MUTANTS = ["ep.combine.weights_twice", "ep.residual.dropped_not_passed", "ep.router.softmax_over_all",
           "ep.combine.experts_permuted", "ep.backward.experts_permuted", "ep.capacity.global_batch",
           "ep.aux_loss.local_batch"]


def test_discovered_and_lazy_public_names():
    assert set(PROPERTIES) <= {p.name for p in properties()}
    assert {m.name for m in mutants() if m.name.startswith("ep.")} == set(MUTANTS)
    import distcheck.parallel.ep as ep
    import distcheck.strategies as public

    assert ep.ep_moe_layer is ref.ep_moe_layer and ep.param_counts is models.param_counts
    assert public.EPMoECase.__module__ == "distcheck.strategies"


@pytest.mark.parametrize("name", PROPERTIES)
def test_property_holds_for_the_reference(name):
    assert_property_holds(name)


@pytest.mark.parametrize("edge_cases", [True, False], ids=["edge", "generated"])
@pytest.mark.parametrize("name", MUTANTS)
def test_every_mutant_is_killed(name, edge_cases):
    assert_mutant_killed(name, edge_cases)


@pytest.mark.parametrize("router", list(Router))
def test_backward_by_finite_differences(router):
    rng = np.random.default_rng(0)
    x, wg = rng.normal(size=(8, 3)), rng.normal(size=(3, 4))
    w1, w2, do = rng.normal(size=(4, 3, 4)), rng.normal(size=(4, 4, 3)), rng.normal(size=(8, 3))
    kw = dict(k=2, capacity_factor=1.0, router=router, groups=2)
    grads = ref.moe_layer_backward(x, wg, w1, w2, do, **kw)
    h = 1e-6
    for i, arr in enumerate((x, wg, w1, w2)):
        for idx in ((0,) * arr.ndim, tuple(s - 1 for s in arr.shape)):
            plus, minus = [a.copy() for a in (x, wg, w1, w2)], [a.copy() for a in (x, wg, w1, w2)]
            plus[i][idx] += h
            minus[i][idx] -= h
            numeric = ((ref.moe_layer(*plus, **kw)[0] - ref.moe_layer(*minus, **kw)[0]) * do).sum() / (2 * h)
            assert abs(numeric - grads[i][idx]) < 1e-5


def test_capacity_priority_and_residual_by_hand():
    assert ref.expert_capacity(7, 4, 2, 1.25) == 5 and ref.expert_capacity(4, 2, 1, 0.5) == 1
    # three tokens all choose expert 0 first, expert 1 second; capacity 2: choice 0 of tokens 0, 1 kept, token 2's
    # first choice dropped; then the second choices of tokens 0, 1 fill expert 1
    slots = ref.assign_slots(np.array([[0, 1], [0, 1], [0, 1]]), 2, 2)
    assert slots.tolist() == [[0, 0], [1, 1], [-1, -1]]
    x = np.array([[1.0], [2.0], [3.0]])
    out, _, r = ref.moe_layer(x, np.array([[1.0, 0.0]]), np.ones((2, 1, 1)), np.ones((2, 1, 1)), k=2,
                              capacity_factor=2 / 3)
    assert r.capacity == 2 and out[2].tolist() == [3.0]            # token 2 passes through the residual
    assert out[0].tolist() == [2.0]                                # x + (g0 + g1) x with g0 + g1 = 1


def test_aux_loss_is_switch_eq_4_for_top_1():
    probs = np.array([[0.75, 0.25], [0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])
    experts = np.array([[0], [0], [1], [0]])
    f, P = np.array([3 / 4, 1 / 4]), probs.mean(axis=0)
    assert ref.aux_loss(probs, experts, 2, alpha=0.01) == pytest.approx(0.01 * 2 * float(f @ P), rel=1e-15)


def test_published_parameter_counts():
    assert models.param_counts(models.MIXTRAL_8X7B) == (46_702_792_704, 12_879_925_248)     # 46.7B / 12.9B
    assert models.param_counts(models.DEEPSEEK_V3) == (671_026_404_352, 37_552_282_624)     # 671B / 37B


@pytest.mark.parametrize("call, field", [
    (lambda: ref.expert_capacity(4, 2, 1, 0), "capacity_factor"),
    (lambda: ref.route(np.zeros((2, 3)), 1, "softmax"), "router"),
    (lambda: ref.moe_layer(np.zeros((3, 1)), np.zeros((1, 2)), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)), k=1,
                           groups=2), "tokens"),
    (lambda: ref.moe_layer(np.zeros((2, 1)), np.zeros((1, 2)), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)), k=3), "k"),
    (lambda: ref.expert_shards(np.zeros((3, 1, 1)), 2), "ep"),
    (lambda: models.MoEConfig(vocab_size=1, h=1, num_layers=1, attention_shapes=(), num_experts=2, k=3,
                              expert_ffn=1), "k"),
])
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.field == field
