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
from distcheck.runners import collectives, fsdp, mesh, tensor_parallel, zero1  # noqa: E402

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


def _counted_collectives(ctx):
    """torch.distributed's c10d calls and a functional collective, each recorded once; barrier and
    calls outside the counter not at all; a rooted reduce recorded by name."""
    import torch as t
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    x = t.ones(3, dtype=t.float64)
    with collectives.ByteCounter() as counter:
        dist.all_reduce(x)
        y = fc.all_reduce(x, "sum", dist.group.WORLD)
        float(y.sum())
        out = [t.empty(3, dtype=t.float64) for _ in range(ctx.world_size)]
        dist.all_gather(out, x)
        dist.barrier()
        if ctx.backend != "threaded":  # the threaded group has no reduce
            dist.reduce(x, 0)
    dist.all_reduce(x)
    return counter.records


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["gloo", "threaded"])
def test_byte_counter_records_c10d_calls_once_on_every_backend(backend, gloo2, threaded4):
    # the threaded group bypasses the dispatcher: its own methods are counted, without
    # counting the functional all-reduce twice or the barrier at all
    pool = gloo2 if backend == "gloo" else threaded4
    n = pool.world_size
    expected = [("all_reduce", 24), ("all_reduce", 24), ("all_gather", 24 * n)]
    expected += [("reduce", 24)] if backend == "gloo" else []
    assert pool.run(_counted_collectives) == [expected] * n


def test_chunk_bounds_follow_array_split():
    assert collectives.chunk_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]


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


def _traceback_of(exc: BaseException) -> str:
    import traceback

    try:
        raise exc
    except BaseException:
        return traceback.format_exc()


class _FailingWorld:
    world_size, backend = 3, "gloo"

    def __init__(self, error):
        self.error = error

    def run(self, fn, *args, **kwargs):
        raise self.error


def _three_rank_failure():
    from distcheck.errors import RankFailure

    tbs = {r: _traceback_of(ValueError(f"bad value on rank {r}\n  second line of the message")) for r in range(3)}
    err = RankFailure(0, tbs[0] + "\n(also failed: ranks [1, 2])\n(ranks [3] had not finished and were stopped)")
    err.failures = tbs
    return err


def test_run_guarded_keeps_the_first_failing_ranks_exception_line():
    from distcheck.errors import RankFailure, WorldTimeout

    _, detail = collectives.run_guarded(_FailingWorld(_three_rank_failure()), None)
    assert detail == "RankFailure: rank 0 failed: ValueError: bad value on rank 0 (also failed: ranks [1, 2])"
    # a rank that died has no exception line: how it ended comes first in its text
    died = RankFailure(1, "rank 1 was killed by SIGSEGV (no Python exception)\nfaulthandler output:\n"
                          "Fatal Python error: Segmentation fault\n  File \"x.py\", line 3 in f\n")
    assert collectives.run_guarded(_FailingWorld(died), None)[1] == \
        "RankFailure: rank 1 failed: rank 1 was killed by SIGSEGV (no Python exception)"
    # a long message is cut, never the exception type
    long = RankFailure(2, _traceback_of(KeyError("k" * 1000)))
    long.failures = {2: long.traceback_text, 5: "x"}
    text = collectives.run_guarded(_FailingWorld(long), None)[1]
    assert text.startswith("RankFailure: rank 2 failed: KeyError: 'kkk") and len(text) == collectives.FAILURE_DETAIL_CHARS
    stuck = WorldTimeout("step did not finish within timeout_s=1 on backend 'gloo': ranks [1] stuck\n--- rank 1 ---\nstack")
    assert collectives.run_guarded(_FailingWorld(stuck), None)[1] == \
        "WorldTimeout: step did not finish within timeout_s=1 on backend 'gloo': ranks [1] stuck"


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


def test_default_fsdp_examples_cap_the_global_batch():
    at = {n: {e["optimizer"]: e["batch"] for e in fsdp.default_fsdp_examples(n)} for n in (1, 2, 4, 8, 32, 1024)}
    assert at[2] == {"sgd": 4, "adam": 6} and at[8] == {"sgd": 16, "adam": 24}  # 2 and 3 rows per rank, as before
    assert at[32] == at[1024] == fsdp.MAX_DEFAULT_BATCH  # 64 rows at 32 ranks broke the exact second SGD step


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fsdp2_stays_bitwise_at_32_ranks_with_ranks_holding_no_rows():
    sgd = [e for e in fsdp.default_fsdp_examples(32) if e["optimizer"] == "sgd"]
    with RankPool(32, backend="threaded", timeout_s=90) as pool:
        rows = by_check(fsdp.run_fsdp_checks(pool, examples=sgd))
    assert {r.verdict for r in rows.values()} == {PASS}, [r.detail for r in rows.values()]
    assert rows["fsdp2.params_match_single_process[reshard=True]"].max_error == 0.0


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


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16, 1024])
def test_default_tp_examples_shard_at_every_world_size(n):
    mlp_ex, att = tensor_parallel.default_tp_examples(n)
    assert mlp_ex["ffn"] % n == 0 and att["num_kv_heads"] % n == 0
    assert att["num_heads"] == 2 * att["num_kv_heads"]  # grouped-query at every n
    assert tensor_parallel.tp_unmet_rule(mlp_ex, n) is None and tensor_parallel.tp_unmet_rule(att, n) is None
    if n in (1, 2, 4):  # the fixed example of earlier versions
        assert (mlp_ex["ffn"], att["num_heads"], att["num_kv_heads"], att["head_dim"]) == (8, 8, 4, 4)
    assert tensor_parallel.tp_unmet_rule(tensor_parallel.default_tp_examples(4)[1], 8) == "tp=8 must divide num_kv_heads=4"


@pytest.mark.multiprocess
def test_tp_runs_at_world_sizes_3_and_8():
    """tp=8 broke num_kv_heads=4; tp=3 broke ffn=8, and DTensor's b/3 rounds (not bitwise, within the bound)."""
    for n in (3, 8):
        with RankPool(n, backend="threaded", timeout_s=90) as pool:
            rows = by_check(tensor_parallel.run_tp_checks(pool))
        assert {r.verdict for r in rows.values()} == {PASS}, [r.detail for r in rows.values()]
        assert rows["tp.attention.allreduce_per_forward"].world_size == n
        out = rows["tp.mlp.output"]
        if n == 3:
            assert out.bound > 0 and out.max_error <= out.bound and "power of two" in out.detail
        else:
            assert out.bound == 0.0 and out.max_error == 0.0 and "bitwise" in out.detail


@pytest.mark.multiprocess
def test_tp_example_that_cannot_shard_gives_skip_rows_naming_the_rule(threaded4):
    mlp_ex = dict(tensor_parallel.default_tp_examples(4)[0], ffn=6)
    att = dict(tensor_parallel.default_tp_examples(4)[1], num_heads=4, num_kv_heads=2)
    rows = tensor_parallel.run_tp_checks(threaded4, examples=[mlp_ex, att])
    assert [(r.check, r.verdict) for r in rows][::3] == [("tp.mlp.output", SKIP), ("tp.attention.output", SKIP)]
    assert {r.verdict for r in rows} == {SKIP}
    assert rows[0].detail == "tp=4 must divide ffn=6" and rows[3].detail == "tp=4 must divide num_kv_heads=2"


def test_tp_rejects_tp_not_dividing_kv_heads():
    from types import SimpleNamespace

    ctx = SimpleNamespace(rank=0, world_size=3, backend="gloo", device=torch.device("cpu"))
    ex = dict(tensor_parallel.default_tp_examples()[1])
    with pytest.raises(ConfigError, match="tp=3 must divide num_kv_heads=4"):
        tensor_parallel.tp_rank(ctx, ex)


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


# --------------------------------------------------------------------------- rendering


def test_fsdp_row_suffixes_survive_the_rendered_table():
    """Rich would read ``[reshard=True]`` as markup and drop it; report.render_table escapes it."""
    from rich.console import Console

    from distcheck.report import CheckResult, render_table

    rows = [CheckResult(f"fsdp2.params_match_single_process[reshard={v}]", "gloo", PASS, 2, 2, detail=f"[reshard={v}] ok")
            for v in (True, False)]
    for width in (200, 80):  # the table, and the one-line-per-row layout below 100 columns
        console = Console(record=True, width=width, color_system=None)
        render_table(rows, console=console)
        text = console.export_text()
        assert "[reshard=True]" in text and "[reshard=False]" in text, text
