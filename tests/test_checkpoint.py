"""Checkpoints (distcheck.parallel.checkpoint): the properties and their mutants, the closed forms by hand,
the folder swap under a real SIGKILL, resharding with torch.distributed.checkpoint between worlds of 2 and
4 ranks, and the ``checkpoint`` contract on torch DCP, the examples' equal-shards loader and the wrong
checkpoints of examples/checkpoint_mutants.py."""

from __future__ import annotations

import os
import signal
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distcheck.closed_form import get
from distcheck.core.errors import ConfigError
from distcheck.engine import registry
from distcheck.engine.mutants import kill_mutant, mutants
from distcheck.engine.runner import run_property
from distcheck.parallel import checkpoint as ck

registry.load()
_PROPS = [p.name for p in registry.properties("checkpoint")]
_MUTANTS = [m.name for m in mutants() if m.name.startswith("checkpoint.")]


@pytest.mark.parametrize("name", _PROPS)
def test_property_holds_on_the_reference(name):
    row = run_property(registry.get(name))
    assert row.verdict == "pass", row.detail


@pytest.mark.parametrize("name", _MUTANTS)
def test_mutant_is_killed(name):
    row = kill_mutant(name)
    assert row.extra["outcome"] == "killed", row.detail


def test_every_property_kills_a_mutant():
    assert {m.kills for m in mutants() if m.name in _MUTANTS} == set(_PROPS)


def test_the_70b_audit_numbers():
    # bf16 weights alone; with fp32 master weights and Adam's moments, 14 bytes per parameter (ZeRO 3.1: 16 less
    # the 2 bytes of gradient a checkpoint does not hold)
    assert get("checkpoint.bytes_total.model").evaluate(params=70 * 10**9, param_bytes=2) == 140 * 10**9
    assert get("checkpoint.bytes_per_param.mixed_adam").evaluate() == 14
    assert get("checkpoint.bytes_total.mixed_adam").evaluate(params=70 * 10**9) == 980 * 10**9
    # fp32 Adam, sharded over 64 FSDP2 ranks: (4 + 8) * 7e10 / 64 per rank, plus 4 B of step per tensor
    assert get("checkpoint.bytes_per_rank.sharded").evaluate(params=70 * 10**9, tensors=0, param_bytes=4,
                                                              world_size=64) == 12 * 70 * 10**9 // 64


def test_the_checkpoint_golden_key_audits_and_a_wrong_figure_fails(tmp_path):
    """golden/checkpoint.toml: every claim holds (``distcheck audit checkpoint`` exits 0); the same key with the
    mixed-Adam total sized at training's 16 B/param (the gradients counted: 1,120 GB), or the FSDP2 x TP rank's
    share split over tp alone (840e9 / 8 B), audits wrong and its golden row FAILs."""
    from distcheck.audit import audit_file
    from distcheck.cli import main
    from distcheck.golden import default_golden_dir, verify

    key = default_golden_dir() / "checkpoint.toml"
    assert main(["audit", "--strict", str(key), "--format", "json"]) == 0
    assert {v.claim.id: v.verdict for v in audit_file(key).claims} == {
        f"checkpoint.70b.{k}": "holds" for k in ("weights_total", "mixed_adam_per_param", "mixed_adam_total",
                                                 "fp32_adam_total", "ddp_rank", "fsdp64_rank", "fsdp_tp_rank",
                                                 "fsdp64_rank_weights")}
    text = key.read_text()
    for old, new, claim in (('claimed = 980\n', 'claimed = "1,120"\n', "mixed_adam_total"),
                            ('claimed = "13,125,002,892"\nunit = "bytes"\nsection = "FSDP2 x TP',
                             'claimed = "105,000,002,892"\nunit = "bytes"\nsection = "FSDP2 x TP', "fsdp_tp_rank")):
        assert text.count(old) == 1
        bad = tmp_path / f"{claim}.toml"
        bad.write_text(text.replace(old, new))
        assert {v.claim.id: v.verdict for v in audit_file(bad).claims}[f"checkpoint.70b.{claim}"] == "wrong"
        rows = {r.check: r for r in verify(bad)}
        assert rows[f"{claim}:checkpoint.70b.{claim}"].verdict == "FAIL"
        assert main(["audit", str(bad), "--format", "json"]) == 1


def test_shards_and_bad_input():
    assert ck.shard_bounds(5, 4) == [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert ck.shard_bounds(3, 2) == [(0, 2), (2, 3)]
    with pytest.raises(ConfigError, match="layout"):
        ck.layout_dims("zero3", [(2,)])
    with pytest.raises(ConfigError, match="tp_dims"):
        ck.layout_dims("tp", [(2,)], [1])
    saved = ck.save({"w": np.arange(4.0)}, [0], 2)
    broken = ck.Checkpoint(saved.shapes, {"w": saved.items["w"][:1]}, None)
    with pytest.raises(ConfigError, match="does not cover"):
        ck.load(broken, [0], 2)
    with pytest.raises(ConfigError, match="never overwritten"):
        with tempfile.TemporaryDirectory() as root:
            ck.save_swap(root, {"a.bin": b"x"}, name="s")
            ck.save_swap(root, {"a.bin": b"y"}, name="s")


# ----------------------------------------------------------------------------- a real SIGKILL


def _killed_save(root, files, name, kill_at) -> int:
    pid = os.fork()
    if pid == 0:  # the child: save, SIGKILLed at the first write reaching kill_at bytes
        def hook(written):
            if written >= kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        try:
            ck.save_swap(root, files, name=name, hook=hook)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.multiprocess
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 200))
def test_a_sigkilled_save_leaves_the_previous_checkpoint(kill_at):
    old, new = {"model.bin": b"o" * 40, "optim.bin": b"p" * 30}, {"model.bin": b"n" * 50, "optim.bin": b"q" * 33}
    with tempfile.TemporaryDirectory() as root:
        ck.save_swap(root, old, name="step-1")
        status = _killed_save(root, new, "step-2", kill_at)
        got = ck.load_swap(root)
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) == signal.SIGKILL
            assert got in (old, new)
        else:
            assert got == new
        ck.save_swap(root, new, name="step-3")
        assert ck.load_swap(root) == new


# ----------------------------------------------------------------------------- torch.distributed.checkpoint


def test_dcp_in_a_new_folder_keeps_the_previous_checkpoint_and_an_overwrite_does_not():
    from distcheck.parallel.checkpoint.checks import world_free_rows

    rows = {r.check: r for r in world_free_rows()}
    assert rows["checkpoint.dcp.interrupted_save"].verdict == "pass"
    over = rows["checkpoint.dcp.interrupted_overwrite"]
    assert over.verdict in ("skip", "pass")
    if over.verdict == "skip":  # torch 2.13: the uncommitted save's values come back through the old .metadata
        assert "a load gave: new" in over.detail or "a load gave: mixed" in over.detail


_PRELOAD = ["torch.distributed.fsdp", "torch.distributed.checkpoint"]


@pytest.fixture(scope="module")
def pools():
    from distcheck.runners import RankPool

    with RankPool(2, backend="gloo", timeout_s=120, preload=_PRELOAD) as two, \
            RankPool(3, backend="gloo", timeout_s=120, preload=_PRELOAD) as three, \
            RankPool(4, backend="gloo", timeout_s=120, preload=_PRELOAD) as four:
        yield {2: two, 3: three, 4: four}


def _held_as_the_reference_says(results, case, layout, dims, tensors):
    """Each rank's local shard of each parameter is the box ck.shard_boxes gives it (the layout is what it says:
    a 2-D layout really holds 2-D shards)."""
    n = len(results)
    for i, (full, dim) in enumerate(zip(tensors, dims, strict=True)):
        boxes = ck.shard_boxes(full.shape, layout, dim, n)
        for r, res in enumerate(results):
            want = full[tuple(slice(lo, hi) for lo, hi in boxes[r])]
            got = res["local"][f"t{i}"]
            assert got.shape == want.shape and got.tobytes() == want.astype(case.dtype).tobytes(), \
                f"{layout} at {n}: rank {r}'s t{i}"


def _reshard(pools, case, n_save, n_load):
    from distcheck.parallel.checkpoint.contracts import bytes_bound
    from distcheck.parallel.checkpoint.harness import load_rank, save_rank
    from distcheck.parallel.checkpoint.plans import TorchDCP

    with tempfile.TemporaryDirectory(prefix="distcheck-ckpt-") as path:
        saved = pools[n_save].run(save_rank, TorchDCP.save, case, path)
        loaded = pools[n_load].run(load_rank, TorchDCP.load, case, path)
    # the saving ranks held the saved tensors in layout A's shards, the loading ranks hold them in layout B's
    whole = [np.asarray(saved[0]["saved"][f"t{i}"], dtype=np.float64) for i in range(len(case.params))]
    _held_as_the_reference_says(saved, case, case.layout_a, case.dims_a, whole)
    _held_as_the_reference_says(loaded, case, case.layout_b, case.dims_b, whole)
    for res in loaded:
        assert set(res["loaded"]) == set(saved[0]["saved"])
        for key, want in saved[0]["saved"].items():
            got = np.asarray(res["loaded"][key])
            assert got.dtype == np.asarray(want).dtype and got.tobytes() == np.asarray(want).tobytes(), key
        for key, want in saved[0]["next"].items():
            assert res["next"][key].tobytes() == want.tobytes(), f"next step of {key}"
    form, top = bytes_bound(case, saved[0]["files"])
    assert form <= saved[0]["bytes"] <= top


@pytest.mark.multiprocess
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_dcp_reshards_between_2_and_4_ranks_bitwise(pools, data):
    from distcheck.parallel.checkpoint.contracts import _cases

    n_save, n_load = data.draw(st.sampled_from([(2, 4), (4, 2)]))
    case = data.draw(_cases(n_save, data.draw(st.sampled_from(["float64", "float32"])), n_load))
    _reshard(pools, case, n_save, n_load)


def test_2d_shard_boxes_by_hand():
    # (dp, tp) = (2, 2), rank r at (r // 2, r % 2). 5 rows split by tp into 3 and 2, then by FSDP2 into 2 + 1 and
    # 1 + 1 (torch's _StridedShard(0, sf=2) over Shard(0)); dim 1 by tp, dim 0 by FSDP2 ((Shard(0), Shard(1)))
    assert ck.shard_boxes((5, 3), "fsdp_tp", 0, 4) == [((0, 2), (0, 3)), ((3, 4), (0, 3)), ((2, 3), (0, 3)),
                                                        ((4, 5), (0, 3))]
    assert ck.shard_boxes((4, 6), "fsdp_tp", 1, 4) == [((0, 2), (0, 3)), ((0, 2), (3, 6)), ((2, 4), (0, 3)),
                                                        ((2, 4), (3, 6))]
    assert ck.shard_boxes((5,), "fsdp_tp", None, 4) == [((0, 3),), ((0, 3),), ((3, 5),), ((3, 5),)]
    assert ck.layouts_at(2) == ck.LAYOUTS and ck.layouts_at(4) == ck.LAYOUTS + ck.LAYOUTS_2D
    with pytest.raises(ConfigError, match="2-D"):
        ck.shard_boxes((4,), "fsdp_tp", 0, 2)


def _two_d_case(world, dtype, a, b):
    from distcheck.parallel.checkpoint.contracts import CkptCase, bulk

    params = (np.arange(15.0).reshape(5, 3) / 8 - 1, np.arange(28.0).reshape(4, 7) / 8, np.arange(5.0) / 8,
              bulk(2**16, 3))
    grads = tuple(tuple(p / 4 + k for p in params) for k in range(3))
    shapes = [p.shape for p in params]
    return CkptCase(world, dtype, params, grads, a[0], ck.layout_dims(a[0], shapes, a[1]), b[0],
                    ck.layout_dims(b[0], shapes, b[1]))


@pytest.mark.multiprocess
@pytest.mark.parametrize("n_save, a, n_load, b", [
    (4, ("fsdp_tp", [0, 1, None, 0]), 2, ("fsdp", None)),       # (_StridedShard, Shard(0)), (Shard(0), Shard(1)) ...
    (4, ("fsdp_tp", [1, 0, 0, None]), 2, ("tp", [0, None, 0, 0])),
    (2, ("tp", [1, 1, None, 0]), 4, ("fsdp_tp", [0, 1, None, 0])),
    (2, ("replicated", None), 4, ("fsdp_tp", [None, 0, 0, 0])),
    (4, ("fsdp_tp", [0, 1, None, 0]), 4, ("fsdp_tp", [1, 0, 0, None])),
])
def test_dcp_reshards_fsdp2_over_tp_on_a_2d_mesh(pools, n_save, a, n_load, b):
    """FSDP2 x TP on a (2, 2) DeviceMesh, saved at 4 and loaded at 2 under one axis, and the reverse: every
    parameter, Adam moment and step bitwise, uneven shards (5 rows: 3 + 2 by tp, then 2 + 1 by FSDP2) included;
    each rank holds the reference's 2-D box."""
    _reshard(pools, _two_d_case(n_save, "float32", a, b), n_save, n_load)


@pytest.mark.multiprocess
def test_dcp_reshards_uneven_fsdp_into_tp(pools):
    """5 rows saved as FSDP2 shards of 3 and 2 at 2 ranks, loaded as tp shards along dim 1 at 4 (and back)."""
    from distcheck.parallel.checkpoint.contracts import CkptCase, bulk

    params = (np.arange(20.0).reshape(5, 4) / 8, np.arange(5.0) / 8, bulk(2**16, 2))
    grads = tuple(tuple(p / 4 + 1 for p in params) for _ in range(3))
    shapes = [p.shape for p in params]
    fsdp, tp = ck.layout_dims("fsdp", shapes), ck.layout_dims("tp", shapes, [1, None, 0])
    _reshard(pools, CkptCase(2, "float32", params, grads, "fsdp", fsdp, "tp", tp), 2, 4)
    _reshard(pools, CkptCase(4, "float64", params, grads, "tp", tp, "fsdp", fsdp), 4, 2)


# ----------------------------------------------------------------------------- the contract


def _certify(pools, target, examples=4, world_size=2, options=None, cert=False):
    from distcheck.certify import certify

    c = certify(target, "checkpoint", world=pools[world_size], dtypes=["float32"], examples=examples,
                options=options, companions={n: p for n, p in pools.items() if n != world_size})
    return c if cert else {v.property: v for v in c.verdicts}


@pytest.mark.multiprocess
def test_torch_dcp_is_certified(pools):
    verdicts = _certify(pools, "distcheck.parallel.checkpoint.plans:TORCH_DCP")
    assert {p: v.verdict for p, v in verdicts.items()} == {"round_trip": "pass", "next_step": "pass", "bytes": "pass"}


def _one_tensor(rows, layout_b):
    from distcheck.parallel.checkpoint.contracts import CkptCase, bulk

    params = (np.arange(1.0, rows + 1) / 8, bulk(2**16, 1))
    grads = tuple((np.full(rows, 0.5), bulk(2**16, 2)) for _ in range(2))
    shapes = [p.shape for p in params]
    return CkptCase(2, "float32", params, grads, "replicated", ck.layout_dims("replicated", shapes), layout_b,
                    ck.layout_dims(layout_b, shapes))


@pytest.mark.multiprocess
def test_the_equal_shards_loader_fails_first_on_3_rows_over_2_ranks(pools):
    """The smallest counterexample by hand: 1 row (shards 1 and 0) and 2 rows (1 and 1) load right, 3 rows
    (2 and 1) do not: rank 1 starts at 1 * 1, not at 2 (every rank compares the whole tensors)."""
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.engine.contracts.targets import make_target
    from examples.my_checkpoint import EqualShardsCheckpoint

    contract = get_contract("checkpoint")
    target = make_target(EqualShardsCheckpoint, "examples.my_checkpoint:EqualShardsCheckpoint", "save_load")
    verdicts = {}
    for rows in (1, 2, 3):
        case = _one_tensor(rows, "fsdp")
        results = pools[2].run(contract.run_rank, target, case, "float32", {})
        verdicts[rows] = contract.check(case, results, 2, "float32", {})["round_trip"]
    assert verdicts[1].ok and verdicts[2].ok
    # the whole tensor, as every rank sees it: row 2 (rank 1's one row) holds row 1's value
    assert not verdicts[3].ok, verdicts[3].message
    assert "loaded t0[3]: from flat index 2 expected" in verdicts[3].message


@pytest.mark.multiprocess
@pytest.mark.slow
def test_certify_shrinks_the_equal_shards_loader_to_an_uneven_shard(pools):
    verdicts = _certify(pools, "examples.my_checkpoint:EqualShardsCheckpoint", examples=30)
    trip = verdicts["round_trip"]
    assert trip.verdict == "FAIL"
    assert "load fsdp" in trip.counterexample or "load tp" in trip.counterexample, trip.counterexample
    # it also writes a replicated tensor once per rank: N copies, over the bound
    assert verdicts["bytes"].verdict == "FAIL"


@pytest.mark.multiprocess
@pytest.mark.parametrize("target, failing", [
    ("StepNotRestored", {"round_trip", "next_step"}),
    ("ModelOnly", {"round_trip", "next_step", "bytes"}),
    ("EveryRankWritesAll", {"bytes"}),
])
def test_wrong_checkpoints_fail_their_properties(pools, target, failing):
    verdicts = _certify(pools, f"examples.checkpoint_mutants:{target}", examples=2)
    assert {p for p, v in verdicts.items() if v.verdict == "FAIL"} == failing


def _fsdp_case(n_save, n_load):
    """5 rows and 5 elements under FSDP2 on both sides: 3 + 2 at 2 ranks, 2 + 2 + 1 at 3, 2 + 2 + 1 + 0 at 4."""
    from distcheck.parallel.checkpoint.contracts import CkptCase, bulk

    params = (np.arange(20.0).reshape(5, 4) / 8, np.arange(5.0) / 8, bulk(2**16, 2))
    grads = tuple(tuple(p / 4 + 1 for p in params) for _ in range(3))
    fsdp = ck.layout_dims("fsdp", [p.shape for p in params])
    return CkptCase(n_save, "float32", params, grads, "fsdp", fsdp, "fsdp", fsdp,
                    None if n_save == n_load else n_load)


def test_the_load_worlds_are_one_fewer_and_twice_up_to_4():
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.parallel.checkpoint.contracts import load_worlds

    assert [load_worlds(n) for n in (1, 2, 3, 4, 5, 8)] == [(2,), (4,), (2, 4), (3,), (4,), (7,)]
    c = get_contract("checkpoint")
    assert c.companion_worlds(4, {"reshard": True}) == (3,) and c.companion_worlds(4, {"reshard": False}) == ()
    assert c.companion_worlds(1, {"reshard": True}) == ()  # below the smallest world nothing runs
    assert repr(_fsdp_case(4, 3)).count("load at 3 fsdp") == 1 and "load at" not in repr(_fsdp_case(4, 4))
    with pytest.raises(ConfigError, match="world_size"):
        load_worlds(0)


class _OneWorld:
    """A world that is not a pool (as a torchrun world is): nothing can be opened beside it."""

    world_size, backend = 4, "gloo"

    def run(self, *args, **kwargs):
        raise AssertionError("nothing may run before the companion worlds are checked")


def test_a_world_that_cannot_open_the_load_worlds_is_refused_before_anything_runs():
    from distcheck.certify import certify

    with pytest.raises(ConfigError, match="must be a RankPool: contract checkpoint also runs examples on worlds of 3 "
                                          "ranks"):
        certify("distcheck.parallel.checkpoint.plans:TORCH_DCP", "checkpoint", world=_OneWorld())
    with pytest.raises(ConfigError, match="must be a RankPool: contract checkpoint-restart also runs examples on "
                                          "worlds of 3 ranks"):
        certify("distcheck.parallel.checkpoint.plans:TRAINING_STATE", "checkpoint-restart", world=_OneWorld())
    with pytest.raises(ConfigError, match=r"companions\[3\].*must be a world of 3 ranks \(its world_size is 4\)"):
        certify("distcheck.parallel.checkpoint.plans:TORCH_DCP", "checkpoint", world=_OneWorld(),
                companions={3: _OneWorld()})


@pytest.mark.multiprocess
def test_a_loader_of_the_loading_worlds_files_fails_on_another_world_only(pools):
    """examples.checkpoint_mutants:CurrentWorldFiles reads rank0.pt .. rank<M-1>.pt, M the loading world's size:
    right at 4 -> 4; at 4 -> 3 rank 3's shard of the bulk tensor (rows 49152 on) is never read and loads as
    zeros; at 3 -> 2 the 5-row tensor's last row (rank 2's) is lost; at 2 -> 4 rank2.pt does not exist. torch
    DCP is right on all four."""
    from distcheck.core.errors import RankFailure
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.engine.contracts.targets import make_target

    contract = get_contract("checkpoint")
    opts = contract.parse_options({})
    wrong = make_target(__import__("examples.checkpoint_mutants").checkpoint_mutants.CurrentWorldFiles,
                        "examples.checkpoint_mutants:CurrentWorldFiles", "save_load")
    dcp = make_target(__import__("distcheck.parallel.checkpoint.plans").parallel.checkpoint.plans.TORCH_DCP,
                      "distcheck.parallel.checkpoint.plans:TORCH_DCP", "save_load")

    def verdicts(target, n_save, n_load):
        case = _fsdp_case(n_save, n_load)
        return contract.check(case, contract.run_case(pools.get, target, case, "float32", opts), n_save,
                              "float32", opts)

    for n_save, n_load in ((4, 4), (4, 3), (3, 2), (2, 4)):
        assert all(v.ok for v in verdicts(dcp, n_save, n_load).values()), (n_save, n_load)
    assert all(v.ok for v in verdicts(wrong, 4, 4).values())
    lost = verdicts(wrong, 4, 3)
    assert not lost["round_trip"].ok and not lost["next_step"].ok and lost["bytes"].ok
    assert lost["round_trip"].message.startswith("saved at 4 ranks, loaded at 3 (ranks of the loading world): ")
    assert "loaded t2[65536]: from flat index 49152 expected" in lost["round_trip"].message
    assert "loaded t0[5, 4]: from flat index 16 expected" in verdicts(wrong, 3, 2)["round_trip"].message
    with pytest.raises(RankFailure, match="rank2.pt"):
        contract.run_case(pools.get, wrong, _fsdp_case(2, 4), "float32", {}, 60)


@pytest.mark.multiprocess
def test_torch_dcp_is_certified_from_4_to_3_and_from_3_to_2(pools):
    for world_size, drawn in ((4, {"4 -> 4", "4 -> 3"}), (3, {"3 -> 3", "3 -> 2", "3 -> 4"})):
        cert = _certify(pools, "distcheck.parallel.checkpoint.plans:TORCH_DCP", examples=8, world_size=world_size,
                        cert=True)
        assert cert.ok, [v.failure for v in cert.verdicts]
        assert {row.columns["worlds"] for row in cert.compositions} == drawn


@pytest.mark.multiprocess
@pytest.mark.slow
def test_certify_fails_the_loading_worlds_loader_at_4_and_certifies_it_on_its_own_world(pools):
    target = "examples.checkpoint_mutants:CurrentWorldFiles"
    verdicts = _certify(pools, target, examples=8, world_size=4)
    assert verdicts["round_trip"].verdict == "FAIL" and verdicts["bytes"].verdict == "pass"
    assert "load at 3 " in verdicts["round_trip"].counterexample
    alone = _certify(pools, target, examples=4, world_size=4, options={"reshard": False})
    assert {v.verdict for v in alone.values()} == {"pass"}


# ----------------------------------------------------------------------------- a whole training state restarted


def _restart_case(n_save, n_load, dtype="float32", dropout=True, save_at=1):
    from distcheck.parallel.checkpoint.restart_contracts import RestartCase

    weight = tuple(tuple(((i * 3 + j) * 5 % 17 - 8) / 8 for j in range(3)) for i in range(5))
    return RestartCase(n_save, dtype, 3, 5, 7, 4, save_at, 3, dropout, weight, None if n_save == n_load else n_load)


def _restart(pools, target, case):
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.engine.contracts.targets import make_target

    contract = get_contract("checkpoint-restart")
    spec = make_target(_obj(target), target, "stateful")
    results = contract.run_case(pools.get, spec, case, case.dtype, {})
    return results, contract.check(case, results, case.world_size, case.dtype, {})


def _obj(ref):
    import importlib

    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.multiprocess
def test_the_whole_training_state_restarts_bitwise_on_another_world(pools):
    """TrainingState (model, Adam, LambdaLR warmup, loader position, RNG, step) saved after 2 of 4 steps with
    dropout on: the restarted run on 3 (from 4), 2 (from 3) and 4 (from 2) ranks ends bit for bit where the
    uninterrupted one does, in float32 and float64; the run moved (the weight after 4 steps is not the saved one,
    and the warmup's LR rose), so the equality is not that of an idle state."""
    for n_save, n_load, dtype in ((4, 3, "float32"), (3, 2, "float64"), (2, 4, "float32")):
        case = _restart_case(n_save, n_load, dtype, save_at=2)
        results, verdicts = _restart(pools, "distcheck.parallel.checkpoint.plans:TRAINING_STATE", case)
        assert all(v.ok for v in verdicts.values()), {p: v.message for p, v in verdicts.items()}
        assert len(results) == n_load
        saved, want = results[0]["saved"], results[0]["want"]
        assert (saved["step"], want["step"], want["dataloader.position"]) == (2, 4, 4)
        assert (saved["lr"], want["lr"]) == (2.0**-4 * 3 / 4, 2.0**-4)  # warmup(2), then warmup(4)
        assert saved["weight"].tobytes() != want["weight"].tobytes() and saved["weight"].dtype == np.dtype(dtype)


@pytest.mark.multiprocess
def test_a_state_without_its_scheduler_or_its_rng_fails_the_restart(pools):
    """SchedulerNotRestored restarts the warmup (epoch 0 where 1 was saved); RngNotRestored draws a fresh job's
    dropout masks: both fail resume and restart at 4 -> 3 and on one world; without dropout no step draws from
    the generator and RngNotRestored restarts right."""
    for n_save, n_load in ((4, 3), (2, 2)):
        _, sched = _restart(pools, "examples.checkpoint_mutants:SchedulerNotRestored", _restart_case(n_save, n_load))
        assert not sched["resume"].ok and not sched["restart"].ok
        assert "lr_scheduler.last_epoch: expected 1, got 0" in sched["resume"].message
        assert "after 4 steps, weight[5, 3]: from flat index 0 expected" in sched["restart"].message
        _, rng = _restart(pools, "examples.checkpoint_mutants:RngNotRestored", _restart_case(n_save, n_load))
        assert not rng["resume"].ok and not rng["restart"].ok
        assert "rng: the generator's state differs from the saved one" in rng["resume"].message
        _, off = _restart(pools, "examples.checkpoint_mutants:RngNotRestored",
                          _restart_case(n_save, n_load, dropout=False))
        assert off["resume"].ok and off["restart"].ok
    assert sched["resume"].message.startswith("saved at 2 ranks after 1 steps, loaded there: rank 0: ")


def _certify_restart(pools, target, world_size=2, options=None):
    from distcheck.certify import certify

    return certify(target, "checkpoint-restart", world=pools[world_size], dtypes=["float32"], examples=6,
                   options=options, companions={n: p for n, p in pools.items() if n != world_size})


@pytest.mark.multiprocess
@pytest.mark.slow
def test_certify_restart_passes_the_whole_state_and_fails_each_part_left_out(pools):
    good = _certify_restart(pools, "distcheck.parallel.checkpoint.plans:TRAINING_STATE", world_size=4)
    assert good.ok and {row.columns["worlds"] for row in good.compositions} == {"4 -> 4", "4 -> 3"}
    for target, options, ok in (("SchedulerNotRestored", None, False), ("RngNotRestored", None, False),
                                ("RngNotRestored", {"dropout": False}, True)):
        cert = _certify_restart(pools, f"examples.checkpoint_mutants:{target}", options=options)
        assert {v.property: v.verdict for v in cert.verdicts} == (
            {"resume": "pass", "restart": "pass"} if ok else {"resume": "FAIL", "restart": "FAIL"}), target


@pytest.mark.multiprocess
def test_a_target_that_is_not_a_stateful_factory_is_refused(pools):
    from distcheck.certify import certify
    from distcheck.engine.contracts.errors import ProtocolError

    with pytest.raises(ProtocolError, match="make\\(parts\\)"):
        certify(object(), "checkpoint-restart", world=pools[2], options={"reshard": False}, examples=1)
    with pytest.raises(ProtocolError, match="must return a Stateful"):
        certify("builtins:str", "checkpoint-restart", world=pools[2], dtypes=["float64"],
                options={"reshard": False}, examples=1)


def test_one_rank_cannot_fail():
    from distcheck.engine.contracts.contract import get_contract

    c = get_contract("checkpoint")
    assert c.min_world_size == 2 and "whole" in c.min_world_reason


# ----------------------------------------------------------------------------- restart under torchrun


def _torchrun(out, kill_at):
    import subprocess
    import sys

    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node=2", "--max-restarts=1", "-m",
                           "distcheck.parallel.checkpoint.restart", str(out), "--steps", "4", "--kill-at",
                           str(kill_at)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    final = np.load(out / "final.npz")
    return {k: final[k] for k in final.files}, (out / "attempts").read_text().split("\n")[:-1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_run_killed_and_restarted_by_torchrun_equals_the_uninterrupted_run(tmp_path):
    killed, attempts = _torchrun(tmp_path / "killed", kill_at=2)
    assert attempts == ["0 0", "1 2"]  # the first attempt from step 0; the restart from step-1's checkpoint
    whole, attempts = _torchrun(tmp_path / "whole", kill_at=-1)
    assert attempts == ["0 0"]
    assert set(killed) == set(whole)
    for key, want in whole.items():
        assert killed[key].dtype == want.dtype and killed[key].tobytes() == want.tobytes(), key


# ----------------------------------------------------------------------------- FSDP2 x tp: an empty tp shard hangs


def test_the_2d_cases_never_draw_tp_along_a_dim_that_leaves_a_tp_rank_empty():
    """torch 2.13's finding torch.fully_shard.empty_tp_shard: fsdp_tp with tp along a width-1 dim 1 hangs in
    full_tensor(); the cases draw every other composition (tp along dim 1 of wider tensors, along dim 0 of
    width-1 tensors) and none of that one, at the world that saves and at the one that loads."""
    from hypothesis import find
    from hypothesis.errors import NoSuchExample

    from distcheck.parallel.checkpoint.contracts import AVOIDED, _cases, tp_dim_choices

    assert tp_dim_choices("fsdp_tp", (3, 1)) == [None, 0] and tp_dim_choices("fsdp_tp", (1, 1)) == [None, 0]
    assert tp_dim_choices("fsdp_tp", (1, 2)) == [None, 0, 1] and tp_dim_choices("fsdp_tp", (1,)) == [None, 0]
    assert tp_dim_choices("tp", (3, 1)) == [None, 0, 1]  # one axis of DTensor: full_tensor() pads, no hang
    assert "torch.fully_shard.empty_tp_shard" in AVOIDED

    def avoided(layout, dims, shapes):
        return layout == "fsdp_tp" and any(d == 1 and s[1] == 1 for d, s in zip(dims, shapes, strict=True))

    search = settings(max_examples=150, database=None, suppress_health_check=list(HealthCheck), deadline=None,
                      derandomize=True)
    for n_save, n_load in ((4, 4), (2, 4), (3, (3, 2, 4))):
        with pytest.raises(NoSuchExample):
            find(_cases(n_save, "float64", n_load), lambda c: avoided(c.layout_a, c.dims_a, c.shapes)
                 or avoided(c.layout_b, c.dims_b, c.shapes), settings=search)
    wide = find(_cases(4, "float64"), lambda c: c.layout_a == "fsdp_tp" and 1 in c.dims_a, settings=search)
    assert any(d == 1 and s[1] >= 2 for d, s in zip(wide.dims_a, wide.shapes, strict=True))
    find(_cases(4, "float64"), lambda c: c.layout_a == "fsdp_tp" and any(
        d == 0 and s[1:] == (1,) for d, s in zip(c.dims_a, c.shapes, strict=True)), settings=search)


@pytest.mark.multiprocess
def test_the_empty_tp_shard_row_is_the_recorded_finding(pools):
    """``checkpoint.fsdp_tp.empty_tp_shard``: rank 1's local shard of a (1, 1) tensor is (0, 0) where its
    placements give (1, 0), read without a collective; labelled as the recorded finding on torch 2.13 (a
    torch that fixes it turns the row into a pass that says the record no longer reproduces)."""
    from distcheck.parallel.checkpoint.checks import EMPTY_TP_SHARD_CHECK, empty_tp_shard_row
    from distcheck.runners.findings import label_findings

    skip = empty_tp_shard_row(pools[2])
    assert (skip.check, skip.verdict) == (EMPTY_TP_SHARD_CHECK, "skip") and "no 2-D (dp, tp) mesh" in skip.detail
    row = empty_tp_shard_row(pools[4])
    assert (row.verdict, row.world_size, row.examples) == ("FAIL", 4, 1)
    assert row.detail == ("a (1, 1) tensor under fsdp_tp (tp along dim 1) at 4 ranks: rank 1's local shard is (0, 0) "
                          "where its placements (Shard(dim=0), Shard(dim=1)) give (1, 0); full_tensor() then "
                          "all-gathers unequal shards over tp and hangs")
    (labelled,) = label_findings([row])
    assert labelled.verdict == "finding" and labelled.extra["finding"]["name"] == "torch.fully_shard.empty_tp_shard"
    assert pools[4].run(_rank_of) == [0, 1, 2, 3]  # nothing hung: the world still answers


def _rank_of(ctx):
    return ctx.rank


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_plain_torch_reproduction_still_hangs():
    """docs/repro/torch_fsdp_tp_hang.py, plain torch on 4 gloo processes, still hangs in full_tensor() on this
    torch: when it stops hanging, retire the finding torch.fully_shard.empty_tp_shard and draw the composition
    again (distcheck.parallel.checkpoint.contracts.AVOIDED)."""
    import subprocess
    import sys

    import torch

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.join(root, "docs", "repro", "torch_fsdp_tp_hang.py"), "20"]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)  # the script stops its ranks itself, 30 s after they start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 1, f"no hang on torch {torch.__version__}: retire the finding\n{out}\n{err[-2000:]}"
    assert "rank 1: local shard (0, 0) under (Shard(dim=0), Shard(dim=1))" in out
    assert "rank 0: local shard (1, 1) under (Shard(dim=0), Shard(dim=1))" in out
    stuck = out.strip().splitlines()[-1]
    assert stuck.startswith("stuck after 20 s: ranks [0, ") and "2" in stuck  # ranks 0 and 2 never returned
    assert err.count("in full_tensor") >= 2  # their stacks: inside DTensor.full_tensor()
