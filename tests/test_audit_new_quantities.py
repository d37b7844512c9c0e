"""The audit's new quantities and readings: bandwidth (nccl-tests), ZeRO bytes per rank with n and the ring
factor, a dp derived from the world size (EP inside or outside DP), K = 14 and 16, fp32 gradients and weights,
the maximum of the components, and a library's GiB printed as GB."""

from __future__ import annotations

from fractions import Fraction

import pytest

from distcheck.audit import audit_key, list_quantities, parse_key, render_quantity_list

META = '[meta]\ntitle = "t"\nsource = "s"\n'


def one(quantity, inputs, claimed, unit, extra=""):
    text = (META + f'\n[[claim]]\nid = "a"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\n'
            f'unit = "{unit}"\n{extra}\n')
    return audit_key(parse_key(text, "k.toml")).claims[0]


def test_nccl_tests_algorithm_and_bus_bandwidth():
    # 1 GB all-reduce in 10 ms on 8 ranks: algbw 100 GB/s, busbw 100 x 2 x 7/8 = 175 GB/s
    inputs = "{ size_bytes = 1e9, time_s = '1/100', n = 8 }"
    assert one("comm.algbw", "{ size_bytes = 1e9, time_s = '1/100' }", 100, "GB/s").verdict == "holds"
    v = one("comm.busbw.all_reduce", inputs, 175, "GB/s")
    assert v.verdict == "holds" and v.computed == 175 * 10**9
    assert one("comm.busbw.all_gather", inputs, "87.5", "GB/s").verdict == "holds"
    assert one("comm.busbw.broadcast", inputs, 100, "GB/s").verdict == "holds"
    # the algorithm bandwidth printed where the bus bandwidth is asked: no documented reading gives it
    assert one("comm.busbw.all_reduce", inputs, 100, "GB/s").verdict == "wrong"


def test_zero_comm_bytes_per_rank_with_n_and_the_ring_factor():
    # ZeRO-3 on 7.5e9 bf16 parameters over 64 ranks: 3 x 63/64 x 7.5e9 x 2 bytes = 44.296875 GB
    v = one("zero.comm_bytes_per_rank.stage3", "{ params = 7.5e9, n = 64 }", "44.30", "GB")
    assert v.verdict == "holds" and v.computed == 44_296_875_000
    # the paper's 3 Psi (45 GB) is the ring factor dropped
    v = one("zero.comm_bytes_per_rank.stage3", "{ params = 7.5e9, n = 64 }", 45, "GB")
    assert v.verdict == "holds-under-another-convention" and v.convention.startswith("ring factor (n-1)/n dropped")
    v = one("zero.comm_bytes_per_rank_no_ring_factor.ddp", "{ params = 1e9, n = 4 }", 3, "GB")
    assert v.verdict == "holds-under-another-convention" and v.convention == "with the ring factor (n-1)/n (nccl-tests)"


def test_dp_derived_from_world_size_with_ep_inside_or_outside():
    assert one("layout.dp_from_world_size", "{ world_size = 16384, tp = 8, pp = 16 }", 128, "GPUs").verdict == "holds"
    v = one("layout.dp_from_world_size", "{ world_size = 1024, tp = 8, pp = 4, ep = 4 }", 8, "GPUs")
    assert v.verdict == "holds-under-another-convention" and v.convention.startswith("EP outside DP")
    v = one("layout.dp_from_world_size.ep_outside_dp", "{ world_size = 1024, tp = 8, pp = 4, ep = 4 }", 32, "GPUs")
    assert v.verdict == "holds-under-another-convention" and v.convention.startswith("EP inside DP")
    v = one("layout.dp_from_world_size", "{ world_size = 100, tp = 8 }", 12, "GPUs")
    assert v.verdict == "wrong" and "world_size=100 over cp*pp*tp=8 is uneven" in v.explanation


def test_deepspeed_zero2_printed_figure_is_k16_read_in_gib():
    # DeepSpeed's ZeRO-2 estimator on 1e9 parameters and 8 GPUs prints "3.96GB": 2 P + 18 P / 8 = 4.25e9 bytes
    v = one("zero.bytes_per_gpu.stage2", "{ params = 1e9, dp = 8 }", "3.96", "GB")
    assert v.verdict == "ambiguous"
    readings = {a["convention"] for a in v.alternatives}
    assert readings == {
        "K = 16 (fp32 gradients counted with the optimizer state: DeepSpeed's ZeRO-2 estimator) + GB read as GiB "
        "(2^30 bytes)",
        "fp32 gradients on top of 16-bit ones (2 + 2 + 4 + K) + GB read as GiB (2^30 bytes)"}
    # its ZeRO-3 figure, 18 P / N: K = 14 or fp32 gradients instead of 16-bit ones
    v = one("zero.bytes_per_gpu.stage3", "{ params = 1e9, dp = 8 }", "2.25", "GB")
    assert v.verdict == "ambiguous" and {a["convention"] for a in v.alternatives} == {
        "K = 14 (18 B/param sharded at stage 3: DeepSpeed's ZeRO-3 estimator)",
        "fp32 gradients instead of 16-bit ones (2 + 4 + K)"}


def test_maximum_of_components_on_zero_per_gpu():
    v = one("memory.per_gpu_bytes.zero3", '{ params = 64e9, dp = 64, activation_bytes = "64 GB" }', 64, "GB")
    assert v.verdict == "holds-under-another-convention"
    assert v.convention == "the maximum of the components instead of their sum (state, activations)"


def test_new_quantities_are_listed_with_sources():
    items = {q["name"]: q for q in list_quantities()}
    for name in ("comm.algbw", "comm.busbw.all_reduce", "comm.busbw.reduce", "zero.comm_bytes_per_rank.stage3",
                 "zero.comm_bytes_per_rank_no_ring_factor.stage3", "layout.dp_from_world_size",
                 "layout.dp_from_world_size.ep_outside_dp", "zero.bytes_per_gpu.components.stage2",
                 "memory.max_of_state_and_activations_bytes", "memory.per_gpu_bytes_max.zero1"):
        assert items[name]["source"], name
    assert "nccl-tests doc/PERFORMANCE.md" in items["comm.busbw.all_reduce"]["source"]
    assert items["comm.algbw"]["unit"] == "bytes_per_second"
    table = render_quantity_list("table")
    assert "comm.busbw.all_reduce" in table and "layout.dp_from_world_size" in table


@pytest.mark.parametrize("unit, factor", [("GB/s", 10**9), ("GiB/s", 2**30), ("B/s", 1), ("MiB/s", 2**20)])
def test_bandwidth_units(unit, factor):
    from distcheck.audit.claim_units import unit_factor

    assert unit_factor("bytes_per_second", unit) == Fraction(factor)


# ---------------------------------------------------------------- a difference that is exactly one component

_P8 = 8_030_261_248  # llama-3-8b, untied, RMS norms with a final norm, no biases


@pytest.mark.parametrize("claimed, which", [
    (_P8 - 4096, "the final norm's weights (-4,096 params, final_norm = 0)"),
    (_P8 - 128256 * 4096, "the output head's vocab_size x hidden_size weights (a tied embedding counted once, or "
                          "twice) (-525,336,576 params, tied = 1)"),
    (_P8 + 32 * (4096 + 2 * 1024), "the q, k, v biases (+196,608 params, qkv_bias = 1)"),
    (_P8 + 65 * 4096, "the norm biases (+266,240 params, norm_biases = 1)"),
])
def test_a_count_off_by_one_component_names_it(claimed, which):
    v = one("params.decoder_only", '{ model = "llama-3-8b" }', f'"{claimed}"', "params")
    assert v.verdict == "wrong"
    assert f"; the difference is exactly {which}; no documented convention reproduces it" in v.explanation


def test_a_count_off_by_something_else_names_nothing():
    v = one("params.decoder_only", '{ model = "llama-3-8b" }', f'"{_P8 - 4095}"', "params")
    assert v.verdict == "wrong" and "the difference is exactly" not in v.explanation


# ---------------------------------------------------------------- automatic checks from known relations


def _audit(*claims):
    text = META + "".join(f'\n[[claim]]\n{c}\n' for c in claims)
    return audit_key(parse_key(text, "k.toml"))


def _c(cid, quantity, inputs, claimed, unit="GB"):
    return f'id = "{cid}"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\nunit = "{unit}"'


def test_a_memory_table_and_its_total_are_checked_without_a_hand_written_check():
    rows = [_c("w", "memory.weights_bytes", "{ params = 7e9 }", 14),
            _c("g", "memory.grads_bytes", "{ params = 7e9 }", 14),
            _c("o", "memory.optimizer_bytes", "{ params = 7e9 }", 84)]
    good = _audit(*rows, _c("t", "memory.train_state_bytes", "{ params = 7e9 }", 112))
    auto = [k for k in good.checks if k.id.startswith("auto:sum:")]
    assert [(k.id, k.verdict, k.automatic) for k in auto] == [("auto:sum:w+g+o=t", "consistent", True)]
    # an optimizer row of 86 GB (wrong on its own): the rows no longer add up to the printed total
    bad = _audit(*rows[:2], _c("o", "memory.optimizer_bytes", "{ params = 7e9 }", 86),
                 _c("t", "memory.train_state_bytes", "{ params = 7e9 }", 112))
    (k,) = [k for k in bad.checks if k.id.startswith("auto:sum:")]
    assert k.verdict == "contradiction" and k.explanation.startswith("14 GB + 14 GB + 86 GB = 114 GB")


def test_a_total_with_an_activations_row_and_a_zero_table_on_another_tables_rows():
    r = _audit(_c("s", "memory.train_state_bytes", "{ params = 1e9 }", 16), _c("a", "reported.fact", "{}", 4),
               _c("t", "memory.state_plus_activations_bytes", '{ params = 1e9, activation_bytes = "@a" }', 20),
               _c("z0", "zero.bytes_per_gpu.stage0", "{ params = 1e9, dp = 8 }", 16),
               _c("z3", "zero.bytes_per_gpu.stage3", "{ params = 1e9, dp = 8 }", 2),
               _c("m3", "memory.per_gpu_bytes.zero3", '{ params = 1e9, dp = 8, activation_bytes = "@a" }', 6))
    auto = {k.id: k.verdict for k in r.checks if k.id.startswith("auto:")}
    assert auto == {"auto:sum:s+a=t": "consistent", "auto:sum:z3+a=m3": "consistent", "auto:equal:z0+s": "consistent"}


def test_an_explicit_check_is_not_repeated():
    rows = [_c("w", "memory.weights_bytes", "{ params = 7e9 }", 14),
            _c("g", "memory.grads_bytes", "{ params = 7e9 }", 14),
            _c("o", "memory.optimizer_bytes", "{ params = 7e9 }", 84),
            _c("t", "memory.train_state_bytes", "{ params = 7e9 }", 112)]
    text = META + "".join(f'\n[[claim]]\n{c}\n' for c in rows) + (
        '\n[[check]]\nid = "x"\nkind = "sum"\ntotal = "t"\nparts = ["o", "g", "w"]\n')
    r = audit_key(parse_key(text, "k.toml"))
    assert [k.id for k in r.checks] == ["x"]


# ---------------------------------------------------------------- the mesh order is an input of every layout.* quantity


def test_a_rank_printed_under_megatrons_order_is_audited_under_it():
    # tp=2, dp=2, pp=2; coordinates tp 1, dp 1, pp 0. Llama 3's order (tp, cp, pp, dp): 1 + 2*0 + 4*1 = 5;
    # Megatron-core's tp-cp-ep-dp-pp: 1 + 2*1 + 4*0 = 3
    base = "tp_index = 1, dp_index = 1, pp_index = 0, tp = 2, pp = 2, dp = 2"
    assert one("layout.rank", f"{{ {base} }}", 5, "count").verdict == "holds"
    assert one("layout.rank", f"{{ {base} }}", 3, "count").verdict == "holds-under-another-convention"
    v = one("layout.rank", f'{{ {base}, order = "tp-cp-ep-dp-pp" }}', 3, "count")
    assert v.verdict == "holds" and v.inputs["order"] == "tp-cp-dp-pp"


def test_coordinates_and_node_locality_under_an_order():
    at_rank_6 = '{ rank = 6, tp = 2, pp = 2, dp = 2, order = "tp-dp-pp" }'
    assert one("layout.coordinate.dp", at_rank_6, 1, "count").computed == 1
    assert one("layout.coordinate.pp", at_rank_6, 1, "count").computed == 1
    # tp outside dp: tp groups stride over dp=4 ranks, so tp=4 spans 16 ranks, two nodes of 8
    v = one("layout.tp_groups_node_local", '{ tp = 4, gpus_per_node = 8, dp = 4, order = "dp-tp-pp" }', "false", "flag")
    assert v.verdict == "holds" and v.computed == 0
    assert one("layout.tp_groups_node_local", "{ tp = 4, gpus_per_node = 8 }", "true", "flag").verdict == "holds"


@pytest.mark.parametrize("inputs, message", [
    ('{ tp_index = 1, tp = 2, pp = 2, order = "tp-tp-dp" }', "order='tp-tp-dp' repeats axis tp"),
    ('{ tp_index = 1, tp = 2, pp = 2, order = "tp-xp-dp" }', "names an unknown axis 'xp'"),
    ('{ tp_index = 1, tp = 2, pp = 2, order = 3 }', "order=3 must be a string"),
    ('{ tp_index = 1, tp = 2, pp = 2, dp = 0 }', "dp=0 must be an integer >= 1 (a parallel degree)"),
    ('{ tp_index = 1, pp_index = 1, tp = 2, pp = 2, order = "tp-pp-dp-cp" }',
     "dp=None is required under order 'tp-pp-dp-cp': an axis lies outside dp"),
    ('{ tp_index = 1, tp = 2, pp = 2, order = "tp-dp" }', "order='tp-dp' must list 'pp' (pp=2 > 1)"),
])
def test_bad_orders_and_degrees_are_bad_input(inputs, message):
    from distcheck.core.errors import AnswerKeyError

    with pytest.raises(AnswerKeyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        one("layout.rank", inputs, 1, "count")


def test_order_is_listed_for_layout_quantities():
    items = {q["name"]: q for q in list_quantities()}
    assert "order" in [i["name"] for i in items["layout.world_size"]["inputs"]]
    assert "order" not in [i["name"] for i in items["memory.train_state_bytes"]["inputs"]]


@pytest.mark.parametrize("inputs", ["{ params = -1 }", '{ params = "-7 B params" }'])
def test_negative_sizes_and_sentinels_are_bad_input_not_judged(inputs):
    from distcheck.core.errors import AnswerKeyError

    with pytest.raises(AnswerKeyError, match="params"):
        one("memory.train_state_bytes", inputs, 16, "GB")


@pytest.mark.parametrize("quantity, inputs, claimed, unit", [
    ("memory.train_state_bytes", "{ params = 1e9 }", -1, "GB"),
    ("layout.world_size", "{ tp = 2, pp = 2, dp = 2 }", -1, "GPUs"),
    ("comm.algbw", "{ size_bytes = 1e9, time_s = 1 }", '"-1"', "GB/s"),
])
def test_a_negative_claimed_size_is_bad_input(quantity, inputs, claimed, unit):
    from distcheck.core.errors import AnswerKeyError

    with pytest.raises(AnswerKeyError, match="is negative: a size or a count is >= 0"):
        one(quantity, inputs, claimed, unit)


def test_a_rank_printed_under_megatrons_order_without_saying_so_is_named():
    base = "tp_index = 1, dp_index = 1, pp_index = 0, tp = 2, pp = 2, dp = 2"
    v = one("layout.rank", f"{{ {base} }}", 3, "count")
    assert v.verdict == "holds-under-another-convention" and v.computed == 5
    assert v.convention.startswith("mesh order tp-cp-ep-dp-pp (Megatron-core's default")
    # without the dp degree Megatron's order cannot be read (pp lies outside dp): no reading is claimed
    v = one("layout.rank", "{ tp_index = 1, dp_index = 1, pp_index = 0, tp = 2, pp = 2 }", 3, "count")
    assert v.verdict == "wrong"
    # a figure stated under its order is not read under another one
    v = one("layout.rank", f'{{ {base}, order = "tp-cp-pp-dp" }}', 3, "count")
    assert v.verdict == "wrong"


def test_a_pipeline_step_is_checked_against_its_work_and_bubble():
    r = _audit(_c("s", "pp.step_ticks.gpipe", "{ p = 4, m = 4 }", 21, "ticks"),
               _c("b", "pp.busy_ticks", "{ p = 4, m = 4 }", 12, "ticks"),
               _c("i", "pp.idle_ticks.gpipe", "{ p = 4, m = 4 }", 9, "ticks"))
    assert {k.id: k.verdict for k in r.checks if k.id.startswith("auto:")} == {"auto:sum:b+i=s": "consistent"}
    r = _audit(_c("s", "pp.step_ticks.gpipe", "{ p = 4, m = 4 }", 21, "ticks"),
               _c("b", "pp.busy_ticks", "{ p = 4, m = 4 }", 12, "ticks"),
               _c("i", "pp.idle_ticks.gpipe", "{ p = 4, m = 4 }", 6, "ticks"))  # (p-1) t_f only
    assert {k.id: k.verdict for k in r.checks if k.id.startswith("auto:")} == {"auto:sum:b+i=s": "contradiction"}
