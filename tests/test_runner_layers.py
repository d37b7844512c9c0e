"""Real torch.distributed layers against distcheck's references and closed forms.

One gloo world of 2 ranks (and one threaded world of 4) is shared by the module;
each layer's checks must pass there, and each has a deliberately wrong setup
that must FAIL, so every property is known to be able to fail.
"""

from __future__ import annotations

import pytest

from distcheck.core.errors import ConfigError
from distcheck.report import FAIL, FINDING, PASS, SKIP

torch = pytest.importorskip("torch")

from distcheck.engine import collectives, drivers  # noqa: E402
from distcheck.parallel.comm import checks as comm_checks  # noqa: E402
from distcheck.parallel.layout import checks as layout_checks  # noqa: E402
from distcheck.runners import RankPool  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def by_check(rows):
    return {r.check: r for r in rows}


# --------------------------------------------------------------------------- collectives


def test_classify_full_size_convention():
    import torch as t

    out, inp = t.zeros(8, dtype=t.float64), t.zeros(4, dtype=t.float64)
    ag = t.ops.c10d._allgather_base_.default
    rs = t.ops.c10d._reduce_scatter_base_.default
    assert collectives.classify(ag, (out, inp)) == ("all_gather", 64)  # S = gathered output
    assert collectives.classify(rs, (inp, out)) == ("reduce_scatter", 64)  # S = full input
    assert collectives.classify(t.ops.aten.add.Tensor, (inp, inp)) is None


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
    assert comm_checks.chunk_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]


@pytest.mark.multiprocess
def test_collective_bytes_match_closed_forms(gloo2):
    rows = by_check(comm_checks.collective_rows(gloo2))
    assert {r.verdict for r in rows.values()} == {PASS}, [r.detail for r in rows.values()]
    # every residue of numel mod 2 (24, 25) and numel = 1, per collective
    assert {r.examples for r in rows.values()} == {3} and "every residue of numel mod 2" in rows[
        "comm.bytes_per_rank.all_reduce"].detail
    # S = 24 float64 = 192 B, n = 2: all-reduce 2(n-1)/n S = 192, the others (n-1)/n S = 96
    assert "S=192 B: 192 B per rank" in rows["comm.bytes_per_rank.all_reduce"].detail
    assert "S=192 B: 96 B per rank" in rows["comm.bytes_per_rank.all_gather"].detail
    assert "S=192 B: 96 B per rank" in rows["comm.bytes_per_rank.reduce_scatter"].detail
    # gloo cannot all-gather uneven shards: the report says so and names the NCCL path
    assert "uneven all_gather unsupported on gloo" in rows["comm.bytes_per_rank.all_gather"].detail
    assert "unsupported" not in rows["comm.bytes_per_rank.all_reduce"].detail


@pytest.mark.multiprocess
def test_collective_check_skips_threaded(threaded4):
    rows = comm_checks.collective_rows(threaded4)
    assert {r.verdict for r in rows} == {SKIP}
    assert "point-to-point" in rows[0].detail


def _traceback_of(exc: BaseException) -> str:
    import traceback

    try:
        raise exc
    except type(exc):
        return traceback.format_exc()


class _FailingWorld:
    world_size, backend = 3, "gloo"

    def __init__(self, error):
        self.error = error

    def run(self, fn, *args, **kwargs):
        raise self.error


def _three_rank_failure():
    from distcheck.core.errors import RankFailure

    tbs = {r: _traceback_of(ValueError(f"bad value on rank {r}\n  second line of the message")) for r in range(3)}
    err = RankFailure(0, tbs[0] + "\n(also failed: ranks [1, 2])\n(ranks [3] had not finished and were stopped)")
    err.failures = tbs
    return err


def test_run_guarded_keeps_the_first_failing_ranks_exception_line():
    from distcheck.core.errors import RankFailure, WorldTimeout

    _, detail = drivers.run_guarded(_FailingWorld(_three_rank_failure()), None)
    assert detail == "RankFailure: rank 0 failed: ValueError: bad value on rank 0 (also failed: ranks [1, 2])"
    # a rank that died has no exception line: how it ended comes first in its text
    died = RankFailure(1, "rank 1 was killed by SIGSEGV (no Python exception)\nfaulthandler output:\n"
                          "Fatal Python error: Segmentation fault\n  File \"x.py\", line 3 in f\n")
    assert drivers.run_guarded(_FailingWorld(died), None)[1] == \
        "RankFailure: rank 1 failed: rank 1 was killed by SIGSEGV (no Python exception)"
    # a long message is cut, never the exception type
    long = RankFailure(2, _traceback_of(KeyError("k" * 1000)))
    long.failures = {2: long.traceback_text, 5: "x"}
    text = drivers.run_guarded(_FailingWorld(long), None)[1]
    assert text.startswith("RankFailure: rank 2 failed: KeyError: 'kkk") and len(text) == drivers.FAILURE_DETAIL_CHARS
    stuck = WorldTimeout("step did not finish within timeout_s=1 on backend 'gloo': ranks [1] stuck\n"
                         "--- rank 1 ---\nstack")
    assert drivers.run_guarded(_FailingWorld(stuck), None)[1] == \
        "WorldTimeout: step did not finish within timeout_s=1 on backend 'gloo': ranks [1] stuck"


def test_iter_pools_rejects_bad_world_size():
    from distcheck.runners.worlds import iter_pools

    with pytest.raises(ConfigError, match="world_size=0"):
        list(iter_pools([0]))


def test_nccl_without_gpu_gives_skip_rows():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the NCCL path runs instead")
    from distcheck import stages

    rows = stages.run_stages([stages.stage("layers")], stages.CheckOptions(backend="nccl", world_sizes=(2,)))
    skipped = {r.check for r in rows if r.verdict == SKIP}
    assert {"comm.bytes_per_rank.all_reduce", "mesh.groups", "zero1", "fsdp2[reshard=True]"} <= skipped
    # a world-free row run in this process (backend "local") has its own reason, whatever the backend
    assert all("nccl" in r.detail.lower() for r in rows if r.verdict == SKIP and r.backend != "local")
    assert {r.verdict for r in rows if r.check not in skipped} <= {PASS, FINDING}  # the world-free rows ran


# --------------------------------------------------------------------------- tensor parallel


@pytest.mark.multiprocess
def test_tp_mlp_and_gqa_attention_through_the_contracts(gloo2):
    from distcheck.certify.runs import contract_rows
    from distcheck.parallel.tp.checks import CERTIFY

    rows = by_check(contract_rows(gloo2, CERTIFY))
    assert {r.verdict for r in rows.values()} == {PASS}, [r.detail for r in rows.values() if r.verdict != PASS]
    props = ("forward", "input_grad", "param_grads", "collectives.forward", "collectives.backward")
    assert set(rows) == {f"tp.{block}.{p}[{dt}]" for block in ("mlp", "attention") for p in props
                         for dt in ("float64", "float32", "bfloat16")}
    assert {r.examples for r in rows.values()} == {10}  # Hypothesis examples, the ci profile's world-level count
    assert rows["tp.mlp.forward[float64]"].max_error == 0.0 and rows["tp.mlp.forward[float64]"].bound == 0.0
    att = rows["tp.attention.forward[float64]"]
    assert 0.0 < att.bound and att.max_error <= att.bound


def test_a_plan_that_shards_down_by_output_rows_is_refused_naming_the_parameter(gloo2):
    from distcheck.certify import ProtocolError, certify

    # the old "colwise_down" plan: right numbers, two all-gathers where one all-reduce belongs; the MLP contract
    # refuses it before any verdict, naming the parameter split along the wrong dimension
    with pytest.raises(ProtocolError, match="parameter down.weight has shape .*split along dim 1"):
        certify("distcheck.parallel.tp.plans:COLWISE_DOWN_MLP", "tensor-parallel-mlp", pool=gloo2, examples=3,
                dtypes=["float64"])


@pytest.mark.multiprocess
def test_tp_threaded_world_of_4(threaded4):
    from distcheck.certify.runs import contract_rows
    from distcheck.parallel.tp.checks import CERTIFY

    rows = contract_rows(threaded4, CERTIFY, examples=4)
    assert {r.verdict for r in rows} == {PASS}, [r.detail for r in rows if r.verdict != PASS]


@pytest.mark.multiprocess
def test_tp_runs_at_world_sizes_3_and_8():
    """tp=3: DTensor adds the bias as b/3 on every rank, which rounds: within the derived bound, not bitwise."""
    import numpy as np

    from distcheck.certify import certify, get_contract
    from distcheck.certify.engine import run_example
    from distcheck.engine.contracts.sharded import TPCase
    from distcheck.engine.contracts.targets import import_target

    target = "distcheck.parallel.tp.plans:MEGATRON_MLP"
    for n in (3, 8):
        with RankPool(n, backend="threaded", timeout_s=90) as pool:
            mlp = certify(target, "tensor-parallel-mlp", pool=pool, examples=6, dtypes=["float64"])
            att = certify("distcheck.parallel.tp.plans:MEGATRON_ATTENTION", "tensor-parallel-attention", pool=pool,
                          examples=4, dtypes=["float64"])
            assert mlp.ok and att.ok, mlp.report() + att.report()
            assert mlp.options == {"partial_bias": True} and mlp.verdicts[0].world_size == n
            # one case with a bias whose n-th share does not round to itself: b = 1 (1/3 rounds, 1/8 does not)
            contract = get_contract("tensor-parallel-mlp")
            spec, opts = contract.resolve(import_target(target)[0], target, contract.parse_options({}))
            ffn = 2 * n
            case = TPCase(tp=n, x=np.ones((1, 2)), grad_output=np.ones((1, 2)), params={
                "up.weight": np.ones((ffn, 2)), "up.bias": np.ones(ffn), "down.weight": np.ones((2, ffn)),
                "down.bias": np.ones(2)}, dims={"hidden_size": 2, "ffn_hidden_size": ffn})
            forward = run_example(pool, contract, spec, case, "float64", opts)["forward"]
        assert forward.ok, forward.message
        if n == 3:
            assert forward.bound > 0 and forward.max_error <= forward.bound
        else:
            assert forward.bound == 0.0 and forward.max_error == 0.0


def test_tp_at_one_rank_gives_skip_rows_naming_why_nothing_can_fail():
    # tp = 1 shards nothing (the tensor-parallel contracts' min_world_size is 2): every property of the layers
    # stage's tp runs is a skip row with the contract's reason, and nothing is run on the world
    from types import SimpleNamespace

    from distcheck.certify.runs import contract_rows
    from distcheck.core.results import check_exit_code
    from distcheck.parallel.tp.checks import CERTIFY

    def never(*args, **kwargs):
        raise AssertionError("a world below the contract's smallest must not run an example")

    rows = contract_rows(SimpleNamespace(world_size=1, backend="gloo", run=never), CERTIFY)
    assert {r.check.split(".")[1] for r in rows} == {"mlp", "attention"} and len(rows) == 30
    assert {r.verdict for r in rows} == {SKIP}
    assert all("world size 1 is below 2" in r.detail and "tp = 1 shards nothing" in r.detail for r in rows)
    assert check_exit_code(rows) == 2  # nothing here can fail: never a pass


def _dtensor_mlp_counts(ctx):
    """One DTensor MLP forward counted by ByteCounter and by torch's CommDebugMode."""
    import torch as t
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    from distcheck.parallel.tp import plans

    mlp = t.nn.Sequential()
    mlp.up, mlp.down = t.nn.Linear(4, 8, dtype=t.float64), t.nn.Linear(8, 4, dtype=t.float64)
    mlp.forward = lambda x: mlp.down(t.relu(mlp.up(x)))
    parallelize_module(mlp, init_device_mesh("cpu", (ctx.world_size,)), plans.MEGATRON_MLP)
    x = t.ones(2, 4, dtype=t.float64)
    with collectives.ByteCounter() as counter:
        float(mlp(x).sum())
    with CommDebugMode() as comm, t.no_grad():
        float(mlp(x).sum())
    return len(counter.records), sum(int(v) for v in comm.get_comm_counts().values())


@pytest.mark.multiprocess
def test_byte_counter_agrees_with_comm_debug_mode_on_a_dtensor_mlp(gloo2):
    # CommDebugMode cannot run on the threaded backend (process-global module hooks); on processes it must agree
    assert gloo2.run(_dtensor_mlp_counts) == [(1, 1), (1, 1)]


# --------------------------------------------------------------------------- DeviceMesh


@pytest.mark.multiprocess
def test_device_mesh_groups_on_gloo_and_threaded(gloo2, threaded4):
    assert layout_checks.mesh_rows(gloo2)[0].verdict == PASS
    r = layout_checks.mesh_rows(threaded4)[0]
    assert r.verdict == PASS and r.examples == 6  # (pp, dp, tp) factorisations of 4
    assert "every factorisation enumerated" in r.detail


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
    from distcheck import stages

    world = _ForeignWorld(gloo2)
    rows = layout_checks.world_rows(world, timeout_s=60.0) + comm_checks.world_rows(world, timeout_s=60.0)
    assert world.calls == 3 + 3 * 3  # 3 (pp, dp, tp) factorisations of 2, then 3 sizes of each ring collective
    assert [(r.check, r.verdict, r.world_size) for r in rows][:2] == [("mesh.groups", PASS, 2),
                                                                        ("comm.bytes_per_rank.all_reduce", PASS, 2)]
    assert not [r for r in rows if r.verdict != PASS]
    with pytest.raises(ConfigError, match="stage='lasers'"):
        stages.stage("lasers")


@pytest.mark.multiprocess
def test_device_mesh_fails_against_wrong_order(threaded4):
    r = layout_checks.mesh_rows(threaded4, order="dp-tp-pp")[0]
    assert r.verdict == FAIL and "group of rank" in r.detail


def test_device_mesh_16384_ranks_fake_backend():
    r = layout_checks.fake_mesh_rows(pp=16, dp=128, tp=8)[0]
    assert r.verdict == PASS and r.world_size == 16_384, r.detail
    wrong = layout_checks.fake_mesh_rows(pp=16, dp=128, tp=8, ranks=[0], order="tp-pp-dp")[0]
    assert wrong.verdict == FAIL


# --------------------------------------------------------------------------- rendering


def test_fsdp_row_suffixes_survive_the_rendered_table():
    """Rich would read ``[reshard=True]`` as markup and drop it; report.render_table escapes it."""
    from rich.console import Console

    from distcheck.report import CheckResult, render_table

    rows = [CheckResult(f"fsdp2[reshard={v}].params", "gloo", PASS, 2, 2, detail=f"[reshard={v}] ok")
            for v in (True, False)]
    for width in (200, 80):  # the table, and the one-line-per-row layout below 100 columns
        console = Console(record=True, width=width, color_system=None)
        render_table(rows, console=console)
        text = console.export_text()
        assert "[reshard=True]" in text and "[reshard=False]" in text, text


def test_exception_line_of_a_message_on_the_next_line_keeps_it_and_the_cause():
    # torch's PipelineStage raises RuntimeError(f"\n  [Stage 1] failed to run forward: ...") from the user's
    # exception: the bare "RuntimeError:" line hid both the stage's message and the user's
    from distcheck.engine.drivers import exception_line

    text = ("Traceback (most recent call last):\n  File \"m.py\", line 4, in forward\n"
            "ValueError: my last stage is broken\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\n  File \"stage.py\", line 900, in forward_one_chunk\n"
            "RuntimeError: \n            [Stage 1] failed to run forward:\n"
            "            args: ('Tensor(torch.Size([1, 4]))',)\n            kwargs: {}\n            \n")
    assert exception_line(text) == ("RuntimeError: [Stage 1] failed to run forward: args: "
                                    "('Tensor(torch.Size([1, 4]))',) (raised from ValueError: my last stage is broken)")
    assert exception_line("Traceback...\nValueError: plain\n") == "ValueError: plain"
