"""The certification engine without a process world: contracts, options, cases, checks, bounds,
targets, configuration, certificates, and the Hypothesis loop on an in-process contract."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.certify.certificate import Certificate, stable_view, write_atomic
from distcheck.certify.config import load_config
from distcheck.certify.engine import certify, reproduce_command
from distcheck.certify.worlds import LocalWorld
from distcheck.core.errors import ConfigError, RankFailure, UnknownQuantityError
from distcheck.engine.contracts import bounds as tb
from distcheck.engine.contracts.checks import agree, compare, compare_collectives
from distcheck.engine.contracts.contract import (
    Option,
    contracts,
    get_contract,
    parse_option_value,
)
from distcheck.engine.contracts.errors import CertificationFailed, ProtocolError, TargetError
from distcheck.engine.contracts.layer import split_bounds
from distcheck.engine.contracts.targets import import_target, make_target, reference_of
from tests.addition_contract import AdditionContract, add_without_carry, good_add

TP_CONTRACTS = ["column-parallel-linear", "row-parallel-linear", "tensor-parallel-attention", "tensor-parallel-mlp"]


# ----------------------------------------------------------------------------- registry and options


def test_the_package_and_the_command_line_import_without_torch():
    import subprocess
    import sys

    code = ("import sys, distcheck.certify, distcheck.certify.cli, distcheck.pytest_plugin, distcheck.cli; "
            "distcheck.cli.build_parser(); distcheck.certify.certify; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr or "torch was imported"


def test_contracts_are_discovered_from_the_package():
    names = [c.name for c in contracts()]
    assert [n for n in names if n in TP_CONTRACTS] == TP_CONTRACTS
    assert all(c.parallelism == "tp" for c in contracts() if c.name in TP_CONTRACTS)
    assert [p.name for p in get_contract("row-parallel-linear").properties] == [
        "forward", "input_grad", "param_grads", "collectives.forward", "collectives.backward"]
    assert {p.regime for p in get_contract("tensor-parallel-attention").properties} == {"bounded", "exact"}


def test_unknown_contract_and_option_name_close_matches():
    with pytest.raises(UnknownQuantityError,
                       match="unknown contract 'row-parallel-linaer'; did you mean row-parallel-linear"):
        get_contract("row-parallel-linaer")
    with pytest.raises(UnknownQuantityError, match="did you mean gather_output"):
        get_contract("column-parallel-linear").parse_options({"gather_ouptut": False})


@pytest.mark.parametrize("kind, text, value", [(bool, "false", False), (bool, "1", True), (int, "3", 3),
                                               (dict, '{"a": 1}', {"a": 1}), (str, "chunk", "chunk")])
def test_option_values_parse_from_the_command_line(kind, text, value):
    assert parse_option_value(Option("o", None, kind, ""), text) == value


@pytest.mark.parametrize("option, value, message", [
    (Option("o", True, bool, ""), "maybe", "option o='maybe' must be true or false"),
    (Option("o", 1, int, ""), True, "option o=True must be an integer"),
    (Option("o", {}, dict, ""), "{oops", "must be a JSON object"),
    (Option("split", "array_split", str, "", ("array_split", "chunk")), "even",
     "must be one of 'array_split', 'chunk'"),
])
def test_bad_option_values_name_the_option(option, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_option_value(option, value)


def test_split_conventions():
    assert split_bounds(3, 2, "array_split") == [(0, 2), (2, 3)]
    assert [b - a for a, b in split_bounds(5, 4, "chunk")] == [2, 2, 1, 0]  # torch.chunk, DTensor's Shard
    assert split_bounds(8, 4, "array_split") == split_bounds(8, 4, "chunk")


# ----------------------------------------------------------------------------- cases sized to the world


@pytest.mark.parametrize("name", TP_CONTRACTS)
@pytest.mark.parametrize("ws", [1, 2, 3, 4])
def test_cases_are_sized_to_the_world_and_exact_in_every_dtype(name, ws):
    contract = get_contract(name)
    opts = contract.parse_options({})

    @settings(max_examples=15, database=None, deadline=None)
    @given(st.data())
    def run(data):
        for dtype in ("float64", "float32", "bfloat16"):
            case = data.draw(contract.cases(ws, dtype, opts))
            assert case.tp == ws
            for spec in contract.specs():
                if spec.shard_dim is not None and spec.name in case.params:
                    assert case.params[spec.name].shape[spec.shard_dim] % ws == 0  # divisible by default
            contract.reference(case, dtype, opts)  # raises when a drawn case is not exact in dtype

    run()


def test_bfloat16_is_skipped_where_no_case_can_be_exact():
    mlp = get_contract("tensor-parallel-mlp")
    assert mlp.cases(64, "bfloat16", mlp.parse_options({})) is None
    assert mlp.cases(64, "float32", mlp.parse_options({})) is not None


def test_uneven_widths_when_the_layer_allows_them():
    row = get_contract("row-parallel-linear")
    opts = row.parse_options({"divisible": "false"})
    seen = set()

    @settings(max_examples=60, database=None, deadline=None)
    @given(row.cases(3, "float64", opts))
    def run(case):
        seen.add(case.params["weight"].shape[1] % 3)

    run()
    assert seen - {0}


# ----------------------------------------------------------------------------- checks


def test_compare_names_ranks_expected_got_error_and_bound():
    e = np.array([[1.0, 2.0]])
    ok = compare("output", "float64", [e, e], [e.copy(), e.copy()], ["float64", "float64"])
    assert ok.ok and ok.max_error == 0.0
    bad = compare("output", "float64", [e, e], [e.copy(), np.array([[1.0, 3.0]])], ["float64", "float64"])
    assert not bad.ok and bad.ranks == (1,)
    assert bad.message == ("output: rank 1 differs from the reference (rank 0 matches); rank 1: expected [[1.0, 2.0]], "
                           "got [[1.0, 3.0]], max error 1 > bound 0 (bitwise)")
    wrong_dtype = compare("output", "bfloat16", [e], [e.copy()], ["float32"])
    assert "rank 0: output has dtype float32, expected bfloat16" in wrong_dtype.message


def test_bounded_comparison_is_decided_exactly_at_the_bound():
    e = np.array([1.0])
    b = np.array([2.0**-20])
    assert compare("y", "float32", [e], [e + 2.0**-20], ["float32"], [b]).ok  # exactly on the bound
    outside = compare("y", "float32", [e], [e + 2.0**-20 + 2.0**-52], ["float32"], [b])
    assert not outside.ok and "derived bound" in outside.message


def test_agree_and_collectives():
    a = np.array([1.0, 2.0])
    assert agree("output", [a, a.copy()]).ok
    d = agree("output", [a, a + 1])
    assert not d.ok and d.ranks == (1,) and "rank 1 has [2.0, 3.0], rank 0 has [1.0, 2.0]" in d.message
    want = [("all_reduce", 64)]
    assert compare_collectives("forward", want, [want, want], "closed form").ok
    c = compare_collectives("forward", want, [want, [("reduce", 64)]], "closed form tp.row.allreduce_count = 1")
    assert c.message == ("forward collectives differ from all_reduce x1 (S=64 B) (closed form tp.row.allreduce_count "
                         "= 1): rank 1: reduce x1 (S=64 B)")


# ----------------------------------------------------------------------------- running error bounds


def test_tracked_attention_matches_the_reference_and_bounds_a_float32_run():
    from distcheck.parallel import tp as attention
    from distcheck.parallel.tp.contracts import TPCase, _tracked_attention

    rng = np.random.default_rng(0)
    s, d, H, G, e = 4, 6, 4, 2, 3
    p = {"q_proj.weight": rng.integers(-2, 3, (H * e, d)) / 8, "k_proj.weight": rng.integers(-2, 3, (G * e, d)) / 8,
         "v_proj.weight": rng.integers(-2, 3, (G * e, d)) / 8, "o_proj.weight": rng.integers(-2, 3, (d, H * e)) / 8}
    x = rng.integers(-3, 4, (1, s, d)) / 4
    case = TPCase(tp=1, x=x, params=p, grad_output=np.ones((1, s, d)) / 4,
                  dims={"hidden_size": d, "num_heads": H, "num_kv_heads": G, "head_dim": e})
    ref = _tracked_attention(case, tb.UNIT_ROUNDOFF["float64"], causal=True)
    expected = attention.attention(x[0], p["q_proj.weight"].T, p["k_proj.weight"].T, p["v_proj.weight"].T,
                                   p["o_proj.weight"].T, H, G, causal=True)
    assert np.all(np.abs(ref["out"].v[0] - expected) <= ref["out"].e[0] * 2)
    # torch's own kernels in float32 and bfloat16 (one process, the unsharded attention block) stay within the bound
    import torch

    from distcheck.engine.contracts.layer import _torch_modules

    for dtype in ("float32", "bfloat16"):
        module = _torch_modules()[1](d, H, G, e, True).to(getattr(torch, dtype))
        with torch.no_grad():
            for name, value in p.items():
                module.get_parameter(name).copy_(torch.as_tensor(value))
            got = module(torch.as_tensor(x, dtype=getattr(torch, dtype))).double().numpy()
        low = _tracked_attention(case, tb.UNIT_ROUNDOFF[dtype], causal=True)
        bound = tb.final_bound(low["out"].e, ref["out"].e)
        err = np.abs(got - ref["out"].v)
        assert np.all(err <= bound) and err.max() > 0, dtype  # inexact, and within the bound
        assert bound.max() < {"float32": 1e-5, "bfloat16": 0.3}[dtype]  # and the bound is not vacuous


def test_exact_products_on_a_dyadic_grid_carry_no_error():
    a, b = tb.exact(np.array([[0.25, 0.5]])), tb.exact(np.array([[0.125], [0.75]]))
    assert tb.matmul(a, b, tb.UNIT_ROUNDOFF["bfloat16"]).e.max() == 0.0
    big = tb.exact(np.array([[255.0, 255.0]]))
    assert tb.matmul(big, tb.exact(np.array([[1.0], [1.0]])), tb.UNIT_ROUNDOFF["bfloat16"]).e.max() > 0  # 510 > 2**8
    assert tb.scale(tb.exact(np.array([3.0])), 0.5, 2.0**-8).e.max() == 0.0  # a power of two scales exactly
    assert tb.gamma(2, 0.25) == 1.0 and math.isinf(tb.gamma(4, 0.25))


# ----------------------------------------------------------------------------- targets


def test_targets_import_or_say_why():
    assert import_target("distcheck.engine.contracts.layer:split_bounds")[0] is split_bounds
    with pytest.raises(TargetError, match="must be 'module:object'"):
        import_target("distcheck.engine.contracts.layer.split_bounds")
    with pytest.raises(TargetError, match="cannot be imported: ModuleNotFoundError"):
        import_target("no_such_package_xyz:Layer")
    with pytest.raises(TargetError, match="has no attribute 'Nope'"):
        import_target("distcheck.engine.contracts.layer:Nope")


def test_targets_travel_by_name_or_by_value():
    assert reference_of(split_bounds) == "distcheck.engine.contracts.layer:split_bounds"

    def local():
        pass

    assert reference_of(local) is None
    named = make_target(split_bounds, None, "factory")
    assert named.pickled is None and named.ref == "distcheck.engine.contracts.layer:split_bounds"
    by_value = make_target({"up": 1}, None, "plan")
    assert pickle.loads(by_value.pickled) == {"up": 1} and by_value.ref == "{'up': int}"
    with pytest.raises(TargetError, match="importable as module:object or picklable"):
        make_target(local, None, "factory")


def test_the_targets_distribution_and_version_are_found():
    import importlib.metadata

    from distcheck.engine.contracts.targets import package_version

    assert package_version("torch.distributed.tensor.parallel:ColwiseParallel") == (
        "torch", importlib.metadata.version("torch"))
    assert package_version("examples.my_tp_layers:RowParallelLinear") == (None, None)  # a module of the checkout


def test_a_target_outside_the_protocol_is_refused_before_anything_runs():
    with pytest.raises(ProtocolError, match="must be a torch.nn.Module class"):
        certify(42, "row-parallel-linear", world=LocalWorld())
    import torch

    class NoBias(torch.nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()

    with pytest.raises(ProtocolError, match="must be constructible as NoBias"):
        certify(NoBias, "row-parallel-linear", world=LocalWorld())


# ----------------------------------------------------------------------------- the engine, in process


def crashes_on_seven(a, b):
    if 7 in (a, b):
        raise ValueError("seven")
    return a + b


def test_engine_passes_counts_and_records_every_property():
    cert = certify(good_add, AdditionContract(), examples=30, seed=3)
    assert cert.ok and [v.verdict for v in cert.verdicts] == ["pass", "pass"]
    assert {v.examples for v in cert.verdicts} == {30}
    assert cert.world_sizes == [1] and cert.backend == "local"


def test_engine_shrinks_one_property_and_reruns_the_others():
    cert = certify(add_without_carry, AdditionContract(), examples=50, seed=3)
    by = {v.property: v for v in cert.verdicts}
    assert by["sum"].verdict == "FAIL" and by["symmetric"].verdict == "pass"
    assert by["sum"].counterexample in ("Pair(a=0, b=16)", "Pair(a=16, b=0)")  # shrunk to the first wrong sum
    assert by["sum"].failure == "f(0, 16) = 0" or by["sum"].failure == "f(16, 0) = 0"
    assert by["sum"].examples > by["sum"].examples_until_failure  # shrinking replays counted
    assert by["symmetric"].examples == 50  # re-run from the start after the failure
    with pytest.raises(CertificationFailed, match=r"test-addition.sum\[float64\] at world size 1 \(local\) FAILED"):
        cert.assert_certified()


def lopsided_add(a, b):  # wrong once a sum reaches 16, and not symmetric where one side is 0 and the other >= 16
    return (a + b) % 16 + (1 if a == 0 and b >= 16 else 0)


def test_a_failure_met_while_another_property_is_shrunk_is_never_a_pass():
    # sum fails first and its shrinking visits Pair(0, 16), where symmetric fails too; symmetric's own run of 50
    # examples (seed 0) never draws a 0 beside a number >= 16, so it alone would pass: the failure met must FAIL it
    cert = certify(lopsided_add, AdditionContract(), examples=50, seed=0)
    by = {v.property: v for v in cert.verdicts}
    assert by["sum"].verdict == "FAIL" and by["sum"].counterexample == "Pair(a=0, b=16)"  # shrunk as before
    assert by["sum"].failure == "f(0, 16) = 1"
    sym = by["symmetric"]
    assert sym.verdict == "FAIL" and sym.counterexample == "Pair(a=0, b=16)", sym.describe("test-addition")
    assert sym.failure.startswith("1 != 0 (met while the failure of sum was shrunk, at example ")
    assert sym.failure.endswith(", and not shrunk: its own run of 50 examples did not fail it again)")
    assert 0 < sym.examples == sym.examples_until_failure <= by["sum"].examples and sym.reproduce == by["sum"].reproduce
    assert not cert.ok
    batched = {v.property: v for v in certify(lopsided_add, AdditionContract(), examples=50, seed=2, batch=10).verdicts}
    assert batched["symmetric"].verdict == "FAIL" and batched["symmetric"].counterexample == "Pair(a=19, b=0)"
    assert batched["symmetric"].failure.startswith("3 != 4 (met while the failure of sum was shrunk, at example ")


def test_a_failure_met_beside_the_first_failure_is_never_a_pass():
    # a world that reports an asymmetric result once, on the first example whose sum is wrong (the example that
    # starts sum's shrinking): symmetric's own run never fails, and still it FAILs with that example
    class OnceAsymmetric:
        world_size, backend, tampered = 1, "fake", None

        def run(self, fn, contract, target, case, *rest):
            got, swapped = fn(None, contract, target, case, *rest)
            if self.tampered is None and got != case.a + case.b:
                self.tampered, swapped = case, swapped + 1
            return [(got, swapped)]

    world = OnceAsymmetric()
    cert = certify(add_without_carry, AdditionContract(), world=world, examples=50, seed=3)
    by = {v.property: v for v in cert.verdicts}
    assert by["sum"].verdict == "FAIL" and by["sum"].counterexample in ("Pair(a=0, b=16)", "Pair(a=16, b=0)")
    sym = by["symmetric"]
    assert sym.verdict == "FAIL" and sym.counterexample == repr(world.tampered) != by["sum"].counterexample
    got = add_without_carry(world.tampered.a, world.tampered.b)
    assert sym.failure == (f"{got} != {got + 1} (met on the example where sum failed first, at example "
                           f"{by['sum'].examples_until_failure}, and not shrunk: its own run of 50 examples did not "
                           "fail it again)")


def test_batches_count_every_example_and_report_the_failing_case():
    cert = certify(good_add, AdditionContract(), examples=40, seed=3, batch=8)
    assert cert.ok and {v.examples for v in cert.verdicts} == {40}  # 5 lists of 8
    bad = certify(add_without_carry, AdditionContract(), examples=48, seed=3, batch=8)
    v = {v.property: v for v in bad.verdicts}["sum"]
    assert v.verdict == "FAIL" and v.counterexample in ("Pair(a=0, b=16)", "Pair(a=16, b=0)")
    assert v.reproduce.endswith("--dtypes float64") and "--batch 8" in v.reproduce


def test_the_exactness_guard_refuses_a_case_too_large_for_the_dtype():
    from distcheck.engine.contracts.sharded import check_exact

    x, w = np.full((1, 8), 8.0), np.full((8, 8), 8.0)  # sums reach 8 * 64 = 512 > 2**8
    check_exact("float32", [(x, w)])
    with pytest.raises(RuntimeError, match="not exact in bfloat16 .* reaches 512 > 2\\*\\*8"):
        check_exact("bfloat16", [(x, w)])


def test_a_crash_fails_every_property_with_one_shrunk_case():
    class Crashing:
        world_size, backend = 1, "fake"

        def run(self, fn, contract, target, case, *rest):
            if 7 in (case.a, case.b):
                raise RankFailure(0, "Traceback (most recent call last):\nValueError: seven\n")
            return [fn(None, contract, target, case, *rest)]

    cert = certify(good_add, AdditionContract(), world=Crashing(), examples=60, seed=5)
    assert [v.verdict for v in cert.verdicts] == ["FAIL", "FAIL"]
    assert {v.failure for v in cert.verdicts} == {"rank 0 raised ValueError: seven"}
    assert {v.counterexample for v in cert.verdicts} <= {"Pair(a=0, b=7)", "Pair(a=7, b=0)"}


def _raised(kind: str, line: int) -> RankFailure:
    return RankFailure(0, f'Traceback (most recent call last):\n  File "layer.py", line {line}, in forward\n'
                          f"{kind}: from line {line}\n")


def test_shrinking_keeps_to_the_crash_it_found_and_names_any_other():
    # a >= 10 raises at one place; 0 < a < 10 with b == 0 at another. The first failure is a KeyError;
    # shrinking a towards 0 meets the ValueError, which must not replace it (Hypothesis tells failures
    # apart by type and place in the same way), and is named in the message rather than hidden.
    class TwoBugs:
        world_size, backend = 1, "fake"

        def run(self, fn, contract, target, case, *rest):
            if case.a >= 10:
                raise _raised("KeyError", 10)
            if case.b == 0 and case.a > 0:
                raise _raised("ValueError", 20)
            return [fn(None, contract, target, case, *rest)]

    cert = certify(good_add, AdditionContract(), world=TwoBugs(), examples=60, seed=5)
    v = cert.verdicts[0]
    assert v.verdict == "FAIL" and v.counterexample == "Pair(a=10, b=0)", v.describe("test-addition")
    assert v.failure.startswith("rank 0 raised KeyError: from line 10 (while shrinking, another failure on Pair(")
    assert "ValueError: from line 20" in v.failure


def test_same_seed_same_verdicts_and_counterexamples():
    first = certify(add_without_carry, AdditionContract(), examples=40, seed=11, profile="dev")
    again = certify(add_without_carry, AdditionContract(), examples=40, seed=11, profile="dev")
    strip = [stable_view(v.__dict__) for v in first.verdicts], [stable_view(v.__dict__) for v in again.verdicts]
    assert strip[0] == strip[1]


def test_reproduce_command_and_invalid_arguments():
    cmd = reproduce_command("m:Obj", "row-parallel-linear", world_size=4, backend="gloo", seed=9, profile="ci",
                            examples=None, dtype="bfloat16", options={"divisible": False, "kwargs": {"a": 1}})
    assert cmd == ("distcheck certify m:Obj --contract row-parallel-linear --world-sizes 4 --backend gloo --seed 9 "
                   "--profile ci --dtypes bfloat16 --option divisible=false --option 'kwargs={\"a\": 1}'")
    with pytest.raises(ConfigError, match="seed=-1"):
        certify(good_add, AdditionContract(), seed=-1)
    with pytest.raises(ConfigError, match="dtypes='float16'"):
        certify(good_add, AdditionContract(), dtypes=["float16"])


# ----------------------------------------------------------------------------- config and certificates


def test_config_targets_and_defaults(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.distcheck]\nbackend = "threaded"\nworld-sizes = [2, 4]\nprofile = "dev"\n\n'
                    '[[tool.distcheck.certify]]\ntarget = "a:B"\ncontract = "row-parallel-linear"\n\n'
                    '[[tool.distcheck.certify]]\ntarget = "c:D"\ncontract = "tensor-parallel-mlp"\n'
                    'world-sizes = [3]\noptions = { divisible = false }\n')
    cfg = load_config(path)
    assert cfg.profile == "dev" and [t.target for t in cfg.targets] == ["a:B", "c:D"]
    assert cfg.targets[0].world_sizes == [2, 4] and cfg.targets[0].backend == "threaded"
    assert cfg.targets[1].world_sizes == [3] and cfg.targets[1].options == {"divisible": False}
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize("text, message", [
    ('[[tool.distcheck.certify]]\ntarget = "a:B"\ncontarct = "x"\n', "did you mean 'contract'"),
    ('[[tool.distcheck.certify]]\ntarget = "a:B"\n', r"\[\[tool.distcheck.certify\]\] #1='contract' is required"),
    ('[tool.distcheck]\nworld-sizes = 2\n', "world-sizes=2 must be a list"),
    ('[tool.distcheck\n', "is not valid TOML"),
])
def test_bad_config_names_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_certificate_json_markdown_and_atomic_write(tmp_path):
    cert = certify(add_without_carry, AdditionContract(), examples=20, seed=2)
    doc = Certificate([cert], command="distcheck certify x --seed 2")
    data = json.loads(doc.to_json())
    assert data["format"] == "distcheck-certificate/1" and data["verdict"] == "failed"
    assert set(data["environment"]) == {"python", "distcheck", "hypothesis", "numpy", "torch"}
    entry = data["certifications"][0]
    assert entry["seed"] == 2 and entry["profile"] == "ci" and entry["contract"] == "test-addition"
    assert entry["verdicts"][0]["counterexample"] and entry["verdicts"][0]["reproduce"]
    md = doc.to_markdown()
    assert md.startswith("# distcheck certificate: FAILED") and "| sum | float64 | 1 | exact |" in md
    assert doc.write(tmp_path / "c.json").read_text() == doc.to_json()
    with pytest.raises(ConfigError, match="must end in .json or .md"):
        doc.write(tmp_path / "c.txt")

    with pytest.raises(TypeError):  # a write that fails half-way
        write_atomic(tmp_path / "d.json", 5)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]  # no temporary file left behind


def test_the_seed_is_0_under_ci_and_drawn_under_dev():
    ci = certify(good_add, AdditionContract(), examples=5)
    assert ci.seed == 0 and ci.profile == "ci"
    dev = {certify(good_add, AdditionContract(), examples=5, profile="dev").seed for _ in range(3)}
    assert len(dev) > 1  # three draws of 32 bits: equal only with probability 2**-63
