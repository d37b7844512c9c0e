"""The ``moe-layer`` contract's ``dropless`` variant and its named conventions: gloo moves zero-length splits (plain
torch.distributed), the split sizes the routing gives, the cases draw zero-length splits and empty experts, the
example's dropless layer certifies at 2 and 4 ranks while its twins fail (wrong expert for an empty one: forward and
grads; padded splits: the all-to-all rows only), and the GShard-style renormalising top-2 fails with the option that
certifies it named."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import find, settings

from distcheck.core.errors import ConfigError
from distcheck.core.results import FAIL
from distcheck.engine.contracts.contract import get_contract
from distcheck.engine.contracts.conventions import Convention, alternatives, hint, search
from distcheck.parallel.ep.contracts import expected, moe_cases
from distcheck.parallel.ep.dropless import check_splits, expected_splits
from distcheck.parallel.ep.strategies import EPMoECase

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # examples/my_moe.py, as `distcheck certify` finds it from the repository root
    sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------- gloo, plain torch.distributed


def _zero_length_splits(ctx):
    """Rank r sends (r j) mod 3 rows to rank j: rank 0 sends and receives nothing, others send zero rows to rank 0
    and to some peers. dist.all_to_all_single, then the functional autograd version with a backward; then a
    receiver expecting one more row from rank 1 than rank 1 sends (rows left as they were)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    r, n = ctx.rank, ctx.world_size
    send = [(r * j) % 3 for j in range(n)]
    recv = [(j * r) % 3 for j in range(n)]
    x = torch.arange(float(sum(send))) + 100 * r
    y = torch.full((sum(recv),), -1.0)
    dist.all_to_all_single(y, x, output_split_sizes=recv, input_split_sizes=send)
    xg = x.clone().requires_grad_(True)
    yg = fc.wait_tensor(fc.all_to_all_single_autograd(xg, recv, send, dist.group.WORLD))
    (yg * (r + 1)).sum().backward()
    short = [1] * n
    expect = [1] * n
    if n > 1 and r == 0:
        expect[1] = 2  # rank 1 sends one row: gloo leaves the second as it was
    z = torch.full((sum(expect),), -7.0)
    dist.all_to_all_single(z, torch.arange(float(n)) + 100 * r, output_split_sizes=expect, input_split_sizes=short)
    return y.tolist(), yg.tolist(), xg.grad.tolist(), z.tolist()


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_gloo_moves_zero_length_splits(world):
    pytest.importorskip("torch")
    from distcheck.runners import RankPool

    with warnings.catch_warnings(), RankPool(world_size=world, backend="gloo", timeout_s=60) as pool:
        warnings.simplefilter("ignore")
        got = pool.run(_zero_length_splits)
    for r, (y, yg, grad, z) in enumerate(got):
        want = []
        for j in range(world):  # rank j's rows for r start after what it sends to ranks below r
            start = sum((j * i) % 3 for i in range(r))
            want += [100.0 * j + start + i for i in range((j * r) % 3)]
        assert y == want and yg == want
        # the gradient of a row is (its receiver + 1): the backward sends it back with the splits swapped
        assert grad == [float(j + 1) for j in range(world) for _ in range((r * j) % 3)]
        if r == 0:
            assert z == [0.0, 100.0, -7.0] + [100.0 * j for j in range(2, world)]


# ----------------------------------------------------------------------------- reference and cases


def test_expected_splits_by_hand():
    # ep = 2, E = 4 (experts 0, 1 on rank 0; 2, 3 on rank 1), two tokens per rank, top-2
    experts = np.array([[0, 3], [1, 0], [1, 2], [0, 1]])
    a, b = expected_splits(experts, 2, 4)
    assert a == [[3, 1], [3, 1]] and b == [[3, 3], [1, 1]]
    assert expected_splits(np.array([[2], [3]]), 2, 4) == ([[0, 1], [0, 1]], [[0, 0], [1, 1]])


def test_dropless_cases_draw_zero_length_splits_and_experts_with_no_tokens():
    def zero_split_and_empty_expert(case: EPMoECase) -> bool:
        logits = case.x @ case.wg
        experts = np.argsort(-logits, axis=1, kind="stable")[:, :case.k]
        a, _ = expected_splits(experts, case.ep, case.wg.shape[1])
        empty = np.bincount(experts.ravel(), minlength=case.wg.shape[1]) == 0
        return any(0 in row for row in a) and bool(empty.any())

    for ep in (2, 4):
        found = find(moe_cases(ep, dropless=True), zero_split_and_empty_expert,
                     settings=settings(database=None, max_examples=200))
        assert found.capacity_factor == float("inf") and found.ep == ep
        assert "capacity_factor=inf" in repr(found)


def test_dropless_reference_drops_nothing_and_equals_a_capacity_that_never_binds():
    c = get_contract("moe-layer")
    case = EPMoECase(x=np.ones((4, 1)), wg=np.array([[1.0, 0.0]]), w1=np.ones((2, 1, 1)), w2=np.ones((2, 1, 1)),
                     dout=np.ones((4, 1)), ep=2, k=1, capacity_factor=float("inf"), router="topk_then_softmax")
    got = expected(case, c.parse_options({"dropless": True}))
    assert not got["dropped"].any() and got["capacity"] == 2          # n = 2 tokens per rank, all on expert 0
    assert got["out"].ravel().tolist() == [2.0, 2.0, 2.0, 2.0]
    padded = expected(EPMoECase(**{**case.__dict__, "capacity_factor": 2.0}), c.parse_options({}))
    assert np.array_equal(padded["out"], got["out"]) and np.array_equal(padded["dx"], got["dx"])
    # at capacity factor 1/2 the padded layer drops the second token of each rank: dropless does not
    half = expected(EPMoECase(**{**case.__dict__, "capacity_factor": 0.5}), c.parse_options({}))
    assert half["dropped"].tolist() == [False, True, False, True]


@pytest.mark.parametrize("given, field", [({"dropless": True, "capacity_factor": "1"}, "option capacity_factor"),
                                          ({"dropless": True, "tokens_multiple_of_experts": True},
                                           "option tokens_multiple_of_experts")])
def test_dropless_refuses_the_capacity_options(given, field):
    c = get_contract("moe-layer")
    with pytest.raises(ConfigError) as err:
        c.resolve(lambda ctx, spec: None, "t:f", c.parse_options(given))
    assert err.value.field == field and "dropless=true" in str(err.value)


def test_check_splits_holds_for_the_split_sizes_and_names_a_padded_layer():
    a, b = [[1, 0], [2, 1]], [[1, 2], [0, 1]]
    row = 8
    good = [[(True, ((8, 0), (8, 16))), (False, ((16, 16), (16, 16))), (True, ((8, 16), (8, 0)))],
            [(True, ((16, 8), (0, 8))), (True, ((0, 8), (16, 8)))]]
    assert check_splits("forward", a, b, row, good).ok           # the integer count exchange is not data
    padded = [[(True, ((16, 16), (16, 16)))] * 2, good[1]]
    out = check_splits("forward", a, b, row, padded)
    assert not out.ok and out.ranks == (0,)
    assert ("rank 0: sent [16, 16] B / received [16, 16] B, sent [16, 16] B / received [16, 16] B; the split sizes "
            "give the dispatch sent [8, 0] B, received [8, 16] B, and the combine the reverse (rows [1, 0] out, "
            "[1, 2] in, of 8 B; 0 B sent to the other ranks and 16 B received from them)") in out.message


# ----------------------------------------------------------------------------- conventions named in failures


def test_conventions_search_offers_a_pair_only_when_no_single_change_reproduces():
    options = {"a": False, "b": "x", "c": 1}
    choices = {"a": (False, True), "b": ("x", "y"), "c": (1, 2)}
    assert [n for n, _ in alternatives(options, choices)] == [1, 1, 1, 2, 2, 2]
    labels = {("a", True): "A's", ("b", "y"): "B's"}
    one = search(options, choices, lambda o: o["a"], labels)
    assert one == [Convention((("a", True),), ("A's",))]
    assert hint(one) == "matches convention a=true (A's): certify with --option a=true"
    pair = search(options, choices, lambda o: o["a"] and o["b"] == "y", labels)
    assert hint(pair) == ("matches convention a=true (A's) with b=y (B's): certify with --option a=true "
                          "--option b=y")
    assert search(options, choices, lambda o: False, labels) == [] and hint([]) == ""


# ----------------------------------------------------------------------------- real worlds


@pytest.mark.multiprocess
def test_dropless_example_certified_its_twins_fail_and_the_renormalising_router_is_named():
    pytest.importorskip("torch")
    from distcheck.certify.engine import certify
    from distcheck.runners import RankPool

    dropless = {"dropless": True}
    with warnings.catch_warnings(), RankPool(world_size=2, backend="gloo", timeout_s=90) as pool:
        warnings.simplefilter("ignore")
        good = certify("examples.my_moe:make_dropless", "moe-layer", pool=pool, seed=0, examples=10, options=dropless)
        skip = certify("examples.my_moe:make_dropless_skip_empty", "moe-layer", pool=pool, seed=0, examples=10,
                       options=dropless, dtypes=("float32",))
        padded = certify("examples.my_moe:make_dropless_padded", "moe-layer", pool=pool, seed=0, examples=5,
                         options=dropless, dtypes=("float32",))
        gshard = certify("examples.my_moe:make_renormalised", "moe-layer", pool=pool, seed=0, examples=20,
                         options={"k": 2}, dtypes=("float32",))
        named = certify("examples.my_moe:make_renormalised", "moe-layer", pool=pool, seed=0, examples=10,
                        options={"k": 2, "renormalise": True}, dtypes=("float32",))
    good.assert_certified()
    assert {v.statement for v in good.verdicts if v.property == "tokens"} == {
        "no capacity: no token passes through unchanged, every choice reaches its expert (token conservation)"}
    failed = {v.property: v for v in skip.verdicts if v.verdict == FAIL}
    assert set(failed) == {"forward", "grads"}
    assert "matches convention" not in failed["forward"].failure     # no convention makes it right
    failed = {v.property: v for v in padded.verdicts if v.verdict == FAIL}
    assert set(failed) == {"all_to_all.forward", "all_to_all.backward"}
    assert "differ from two all_to_all_single of the actual split sizes" in failed["all_to_all.forward"].failure
    failed = {v.property: v for v in gshard.verdicts if v.verdict == FAIL}
    assert set(failed) == {"forward", "grads"}
    assert failed["forward"].failure.endswith(
        "; matches convention renormalise=true (GShard top-2, Mixtral: the kept gates divided by their sum, "
        "fairscale's and DeepSpeed's top2gating): certify with --option renormalise=true")
    named.assert_certified()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_dropless_example_certified_on_four_ranks():
    pytest.importorskip("torch")
    from distcheck.certify.engine import certify
    from distcheck.runners import RankPool

    with warnings.catch_warnings(), RankPool(world_size=4, backend="gloo", timeout_s=120) as pool:
        warnings.simplefilter("ignore")
        certify("examples.my_moe:make_dropless", "moe-layer", pool=pool, seed=0, examples=8,
                options={"dropless": True}).assert_certified()


def test_dropless_split_sizes_are_recorded_on_the_threaded_backend_too():
    # torch.distributed calls the threaded group's all_to_all_single past the dispatcher: the recorder hooks it
    pytest.importorskip("torch")
    from distcheck.certify.engine import certify

    good = certify("examples.my_moe:make_dropless", "moe-layer", world_sizes=[2], backend="threaded", seed=0,
                   examples=3, dtypes=("float32",), options={"dropless": True})
    good.assert_certified()
    padded = certify("examples.my_moe:make_dropless_padded", "moe-layer", world_sizes=[2], backend="threaded",
                     seed=0, examples=3, dtypes=("float32",), options={"dropless": True})
    assert {v.property for v in padded.verdicts if v.verdict == FAIL} == {"all_to_all.forward",
                                                                          "all_to_all.backward"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_rank_whose_experts_got_nothing_and_left_the_graph_hangs_in_the_backward():
    # the hang a dropless layer can meet is the layer's, not gloo's: a rank whose experts received no rows builds its
    # combine's input outside autograd, so its backward issues no all-to-all while the other ranks wait in theirs
    pytest.importorskip("torch")
    from distcheck.certify.engine import certify

    cert = certify("examples.my_moe:make_dropless_no_graph", "moe-layer", world_sizes=[2], backend="gloo", seed=0,
                   examples=10, dtypes=("float32",), options={"dropless": True}, timeout_s=10)
    hung = [v for v in cert.verdicts if v.verdict == FAIL]
    assert len(hung) == 1 and hung[0].hung and "step did not finish within timeout_s=10" in hung[0].failure
    # the case that hung: one token per rank, both choosing expert 1 (rank 1's): rank 0's expert gets no rows
    assert hung[0].counterexample.startswith("EPMoECase(ep=2, k=1, capacity_factor=inf")
    assert "wg=[[0.0, 1.0]]" in hung[0].counterexample
