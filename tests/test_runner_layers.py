"""Real torch.distributed layers against distcheck's references and closed forms.

One gloo world of 2 ranks (and one threaded world of 4) is shared by the module;
each layer's checks must pass there, and each has a deliberately wrong setup
that must FAIL, so every property is known to be able to fail.
"""

from __future__ import annotations

import warnings

import pytest

from distcheck.errors import ConfigError
from distcheck.report import FAIL, PASS, SKIP

torch = pytest.importorskip("torch")

from distcheck.runners import RankPool  # noqa: E402
from distcheck.runners import collectives, fsdp, mesh, pipelining, tensor_parallel, zero1  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def by_check(rows):
    return {r.check: r for r in rows}


@pytest.fixture(scope="module")
def gloo2():
    with RankPool(world_size=2, backend="gloo", timeout_s=90) as pool:
        yield pool


@pytest.fixture(scope="module")
def threaded4():
    with RankPool(world_size=4, backend="threaded", timeout_s=90) as pool:
        yield pool


# --------------------------------------------------------------------------- collectives


def test_classify_full_size_convention():
    import torch as t

    out, inp = t.zeros(8, dtype=t.float64), t.zeros(4, dtype=t.float64)
    ag = t.ops.c10d._allgather_base_.default
    rs = t.ops.c10d._reduce_scatter_base_.default
    assert collectives._classify(ag, (out, inp)) == ("all_gather", 64)  # S = gathered output
    assert collectives._classify(rs, (inp, out)) == ("reduce_scatter", 64)  # S = full input
    assert collectives._classify(t.ops.aten.add.Tensor, (inp, inp)) is None


def test_chunk_bounds_follow_array_split():
    assert collectives._chunk_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]


@pytest.mark.multiprocess
def test_collective_bytes_match_closed_forms(gloo2):
    rows = by_check(collectives.run_collective_checks(gloo2))
    assert {r.verdict for r in rows.values()} == {PASS}, [r.detail for r in rows.values()]
    # S = 24 float64 = 192 B, n = 2: all-reduce 2(n-1)/n S = 192, the others (n-1)/n S = 96
    assert "S=192 B: 192 B per rank" in rows["comm.bytes_per_rank.all_reduce"].detail
    assert "S=192 B: 96 B per rank" in rows["comm.bytes_per_rank.all_gather"].detail
    assert "S=192 B: 96 B per rank" in rows["comm.bytes_per_rank.reduce_scatter"].detail
    # gloo cannot all-gather uneven shards: the report says so and names the NCCL path
    assert "uneven all_gather unsupported on gloo" in rows["comm.bytes_per_rank.all_gather"].detail
    assert "unsupported" not in rows["comm.bytes_per_rank.all_reduce"].detail


@pytest.mark.multiprocess
def test_collective_check_skips_threaded(threaded4):
    rows = collectives.run_collective_checks(threaded4)
    assert {r.verdict for r in rows} == {SKIP}
    assert "point-to-point" in rows[0].detail


def test_iter_pools_rejects_bad_world_size():
    with pytest.raises(ConfigError, match="world_size=0"):
        list(collectives.iter_pools([0]))


def test_nccl_without_gpu_is_a_skip_row():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the NCCL path runs instead")
    rows = zero1.run_zero1_checks(2, backend="nccl")
    assert {r.verdict for r in rows} == {SKIP} and "nccl" in rows[0].detail.lower()


# --------------------------------------------------------------------------- ZeRO-1


@pytest.mark.multiprocess
def test_zero1_matches_single_process_and_reference_bytes(gloo2):
    rows = by_check(zero1.run_zero1_checks(gloo2))
    assert rows["zero1.params_match_single_process"].verdict == PASS
    assert rows["zero1.params_match_single_process"].max_error == 0.0
    r = rows["zero1.optimizer_bytes_per_rank"]
    assert r.verdict == PASS, r.detail
    # widths [6, 10, 4]: parameters of 60, 10, 40, 4 elements; largest first to the lightest rank:
    # rank 0 gets [60], rank 1 [40, 10, 4] (54). Adam in float64 keeps 16 B per element:
    # max 960 B against the ideal K * Psi / N = 16 * 114 / 2 = 912 B
    w, most, ideal = r.extra["imbalance"][0]
    assert w == [6, 10, 4] and most == 16 * 60 and ideal == str(16 * 114 // 2)


@pytest.mark.multiprocess
def test_zero1_fails_with_wrong_partition(gloo2):
    def round_robin(numels, dp):
        return [list(range(len(numels)))[r::dp] for r in range(dp)]

    rows = by_check(zero1.run_zero1_checks(gloo2, expected_partition=round_robin))
    assert rows["zero1.optimizer_bytes_per_rank"].verdict == FAIL


@pytest.mark.multiprocess
def test_zero1_threaded_world_of_4(threaded4):
    rows = zero1.run_zero1_checks(threaded4, examples=zero1.default_zero1_examples()[:1])
    assert {r.verdict for r in rows} == {PASS}, [r.detail for r in rows]


# --------------------------------------------------------------------------- FSDP2


@pytest.mark.multiprocess
def test_fsdp2_matches_single_process_and_padded_reference(gloo2):
    rows = by_check(fsdp.run_fsdp_checks(gloo2))
    assert rows["fsdp2.params_match_single_process[reshard=True]"].verdict == PASS
    assert rows["fsdp2.params_match_single_process[reshard=False]"].verdict == PASS
    assert rows["fsdp2.bytes_per_rank"].verdict == PASS, rows["fsdp2.bytes_per_rank"].detail
    # widths 5-7-3, SGD (16 B per parameter), N = 2: Psi = 66, ideal (4+K) Psi/N = 528 B; rank 0 holds the
    # padded halves of dim 0 (4 of 7 rows, 2 of 3 rows): (4*5 + 4 + 2*7 + 2) * 16 = 640 B, x1.212
    assert "widths=[5, 7, 3] sgd: max 640 B vs (4+K)*Psi/N = 528 B (x1.212)" in rows["fsdp2.bytes_per_rank"].detail


@pytest.mark.multiprocess
def test_fsdp2_bytes_fail_against_unpadded_reference(gloo2):
    # Linear(5, 7): dim 0 = 7 is padded to 8 rows on 2 ranks; the unpadded reference is wrong
    rows = by_check(fsdp.run_fsdp_checks(gloo2, examples=fsdp.default_fsdp_examples()[:1], padded_params=False))
    assert rows["fsdp2.bytes_per_rank"].verdict == FAIL
    assert "params" in rows["fsdp2.bytes_per_rank"].detail


@pytest.mark.multiprocess
def test_fsdp2_threaded_world_of_4(threaded4):
    rows = fsdp.run_fsdp_checks(threaded4, examples=fsdp.default_fsdp_examples()[:2])
    assert {r.verdict for r in rows} == {PASS}, [r.detail for r in rows]


# --------------------------------------------------------------------------- tensor parallel


@pytest.mark.multiprocess
def test_tp_mlp_and_gqa_attention(gloo2):
    rows = by_check(tensor_parallel.run_tp_checks(gloo2))
    assert {r.verdict for r in rows.values()} == {PASS}, [r.detail for r in rows.values()]
    assert rows["tp.mlp.output"].max_error == 0.0
    assert rows["tp.attention.output"].max_error <= rows["tp.attention.output"].bound
    assert "{'all_reduce': 1}" in rows["tp.attention.allreduce_per_forward"].detail


@pytest.mark.multiprocess
def test_tp_mis_sharded_mlp_fails_count(gloo2):
    ex = dict(tensor_parallel.default_tp_examples()[0], plan="colwise_down")
    rows = by_check(tensor_parallel.run_tp_checks(gloo2, examples=[ex]))
    assert rows["tp.mlp[colwise_down].output"].verdict == PASS  # still the right numbers...
    count = rows["tp.mlp[colwise_down].allreduce_per_forward"]
    assert count.verdict == FAIL and "all_gather" in count.detail  # ...with the wrong collectives


@pytest.mark.multiprocess
def test_tp_threaded_world_of_4(threaded4):
    rows = tensor_parallel.run_tp_checks(threaded4)
    assert {r.verdict for r in rows} == {PASS}, [r.detail for r in rows]


def test_tp_rejects_tp_not_dividing_kv_heads():
    from types import SimpleNamespace

    ctx = SimpleNamespace(rank=0, world_size=3, backend="gloo", device=torch.device("cpu"))
    ex = dict(tensor_parallel.default_tp_examples()[1])
    with pytest.raises(ConfigError, match="tp=3 must divide num_kv_heads=4"):
        tensor_parallel.tp_rank(ctx, ex)


# --------------------------------------------------------------------------- pipelining


def test_pipeline_tables_against_simulator():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = by_check(pipelining.run_table_checks(max_p=3, max_m=6))
    for name in ("ScheduleGPipe", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
                 "ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
        assert rows[f"pp.table.{name}"].verdict == PASS, rows[f"pp.table.{name}"].detail
    # finding (torch 2.13): Schedule1F1B's own table names micro-batch m on the last rank
    bad = rows["pp.table.Schedule1F1B"]
    assert bad.verdict == FAIL and "p=1, m=1" in bad.detail and "microbatch=1" in bad.detail


def test_gpipe_table_matches_lesson_figure():
    tl = pipelining.table_timeline("ScheduleGPipe", 4, 4)
    assert tl.step_ticks == 21 and str(tl.bubble_fraction) == "3/7"  # lesson: 3 x (4 + 3) ticks, 3/7


@pytest.mark.multiprocess
def test_pipeline_schedules_on_gloo(gloo2):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = by_check(pipelining.run_pipelining_checks(gloo2, tables=False))
    for name in pipelining.SCHEDULES:
        assert rows[f"pp.grads.{name}"].verdict == PASS, rows[f"pp.grads.{name}"].detail
        assert rows[f"pp.grads.{name}"].max_error == 0.0
    for name in ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B"):
        assert rows[f"pp.executed_timeline.{name}"].verdict == PASS
    # torch executes 1F1B correctly (timeline = simulator) but not in its table's order
    assert rows["pp.executed_order.Schedule1F1B"].verdict == FAIL
    assert "rank 1" in rows["pp.executed_order.Schedule1F1B"].detail
    assert rows["pp.executed_order.ScheduleGPipe"].verdict == PASS


@pytest.mark.multiprocess
def test_pipeline_skips_threaded(threaded4):
    rows = pipelining.run_pipelining_checks(threaded4, tables=False, examples=pipelining.default_pipeline_examples(4)[:1])
    assert {r.verdict for r in rows} == {SKIP}


# --------------------------------------------------------------------------- DeviceMesh


@pytest.mark.multiprocess
def test_device_mesh_groups_on_gloo_and_threaded(gloo2, threaded4):
    assert mesh.run_mesh_checks(gloo2)[0].verdict == PASS
    r = mesh.run_mesh_checks(threaded4)[0]
    assert r.verdict == PASS and r.examples == 6  # (pp, dp, tp) factorisations of 4


@pytest.mark.multiprocess
class _ForeignWorld:
    """Any object with run / world_size / backend is a world (a TorchrunWorld is one)."""

    def __init__(self, pool):
        self.world_size, self.backend, self._pool, self.calls = pool.world_size, pool.backend, pool, 0

    def run(self, fn, *args, **kwargs):
        self.calls += 1
        return self._pool.run(fn, *args, **kwargs)


@pytest.mark.multiprocess
def test_layer_drivers_accept_any_world_object(gloo2):
    from distcheck.runners.layers import layer_rows

    world = _ForeignWorld(gloo2)
    rows = layer_rows(world, layers=["mesh", "tensor_parallel"])
    assert world.calls == 3 + 2  # 3 (pp, dp, tp) factorisations of 2, then the MLP and attention examples
    assert [(r.check, r.verdict, r.world_size) for r in rows][:2] == [("mesh.groups", PASS, 2), ("tp.mlp.output", PASS, 2)]
    assert not [r for r in rows if r.verdict != PASS]
    with pytest.raises(ConfigError, match="layers='lasers'"):
        layer_rows(world, layers=["lasers"])


@pytest.mark.multiprocess
def test_device_mesh_fails_against_wrong_order(threaded4):
    r = mesh.run_mesh_checks(threaded4, order="dp-tp-pp")[0]
    assert r.verdict == FAIL and "group of rank" in r.detail


def test_device_mesh_16384_ranks_fake_backend():
    r = mesh.run_fake_mesh_check(pp=16, dp=128, tp=8)[0]
    assert r.verdict == PASS and r.world_size == 16_384, r.detail
    wrong = mesh.run_fake_mesh_check(pp=16, dp=128, tp=8, ranks=[0], order="tp-pp-dp")[0]
    assert wrong.verdict == FAIL
