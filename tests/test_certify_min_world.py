"""No vacuous certificate: every contract declares the smallest world on which its claims can fail;
below it every property is a skip with the reason, and a certification in which nothing could fail
is exit 2 ("nothing here can fail") under ``distcheck certify``, ``distcheck check`` and the pytest
plugin, never "certified". Also: rows of ``[tool.distcheck]`` targets name their target, and
``distcheck check --only certify`` imports targets from the current folder."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from distcheck.certify.certificate import NOTHING_CAN_FAIL, Certificate
from distcheck.core.errors import ConfigError
from distcheck.engine.contracts.contract import Contract, PropertySpec, contracts, register_contract
from distcheck.engine.contracts.errors import CertificationFailed, NothingCanFail
from distcheck.report import FAIL, PASS, SKIP, CheckResult

EXAMPLES = "examples.my_tp_layers"


class _NoRunWorld:
    """A world of ``world_size`` ranks that must never be asked to run anything."""

    backend = "gloo"

    def __init__(self, world_size: int):
        self.world_size = world_size

    def run(self, *args, **kwargs):
        raise AssertionError("a world below the contract's smallest must not run an example")


# ---------------------------------------------------------------- every contract declares its smallest world


def test_every_registered_contract_declares_the_smallest_world_on_which_it_can_fail():
    found = contracts()
    assert len(found) >= 16
    for c in found:
        size, reason = type(c).min_world_size, type(c).min_world_reason
        assert isinstance(size, int) and not isinstance(size, bool) and size >= 1, c.name
        assert isinstance(reason, str) and len(reason.strip()) > 20, c.name
        # a contract on a world certifies collectives: one rank cannot fail them
        assert size >= 2 if c.needs_world else size == 1, c.name
        assert c.cannot_fail(size, c.parse_options(None)) is None or c.name == "pipeline-table", c.name
        if size > 1:
            why = c.cannot_fail(size - 1, c.parse_options(None))
            assert why is not None and reason in why and f"world size {size - 1}" in why, c.name


def test_a_contract_that_does_not_declare_its_smallest_world_is_refused():
    class Undeclared(Contract):
        name = "zz-undeclared"
        parallelism = "test"
        properties = (PropertySpec("p", "holds", "exact"),)

    with pytest.raises(ConfigError, match="Undeclared.min_world_size"):
        register_contract(Undeclared())

    class NoReason(Undeclared):
        name = "zz-no-reason"
        min_world_size = 2

    with pytest.raises(ConfigError, match="NoReason.min_world_reason"):
        register_contract(NoReason())
    from distcheck.certify.engine import certify

    with pytest.raises(ConfigError, match="min_world_reason"):  # an unregistered instance too
        certify(lambda: None, NoReason(), world=_NoRunWorld(2))


# ---------------------------------------------------------------- below the smallest world: skips, never a pass


def test_a_correct_layer_at_world_size_1_is_nothing_certified_and_runs_nothing():
    from distcheck.certify.engine import certify

    cert = certify(f"{EXAMPLES}:RowParallelLinear", "row-parallel-linear", world=_NoRunWorld(1))
    assert len(cert.verdicts) == 15 and {v.verdict for v in cert.verdicts} == {SKIP}
    assert all("world size 1 is below 2" in v.failure and "tp = 1 shards nothing" in v.failure
               for v in cert.verdicts)
    assert not cert.can_fail and not cert.ok and not cert
    assert cert.verdict == NOTHING_CAN_FAIL and "certified" not in cert.report().splitlines()[0]
    with pytest.raises(NothingCanFail, match="nothing here can fail .*tp = 1 shards nothing"):
        cert.assert_certified()
    assert issubclass(NothingCanFail, CertificationFailed)
    certificate = Certificate([cert], command="distcheck certify ...")
    assert json.loads(certificate.to_json())["verdict"] == NOTHING_CAN_FAIL
    assert certificate.to_markdown().startswith(f"# distcheck certificate: {NOTHING_CAN_FAIL}")
    assert "certified" not in certificate.to_markdown().split("|")[0]


@pytest.mark.parametrize("contract, target", [
    ("data-parallel-reducer", "distcheck.parallel.dp.ddp:weighted_allreduce_hook"),
    ("sequence-parallel-mlp", "distcheck.parallel.sp.plans:SEQUENCE_PARALLEL_MLP"),
    ("tensor-parallel-mlp", "distcheck.parallel.tp.plans:MEGATRON_MLP"),
])
def test_every_world_contract_skips_one_rank_with_its_reason(contract, target):
    from distcheck.certify.engine import certify
    from distcheck.engine.contracts.contract import get_contract

    cert = certify(target, contract, world=_NoRunWorld(1))
    assert {v.verdict for v in cert.verdicts} == {SKIP} and not cert.can_fail
    assert {v.failure for v in cert.verdicts} == {get_contract(contract).cannot_fail(1, {})}


def test_a_degenerate_layout_pipeline_tables_of_one_stage_can_fail_nothing():
    from distcheck.certify.engine import certify
    from distcheck.certify.worlds import LocalWorld

    cert = certify("examples.my_pipeline_schedules:one_f_one_b", "pipeline-table", world=LocalWorld(),
                   options={"schedule": "1f1b", "max_stages": 1})
    assert {v.verdict for v in cert.verdicts} == {SKIP} and not cert.can_fail
    assert "max_stages = 1 is degenerate" in cert.verdicts[0].failure


@pytest.mark.multiprocess
def test_acceptance_the_broken_layer_at_world_size_1_exits_2_and_its_certificate_is_not_certified(
        tmp_path, capsys):
    from distcheck.cli import main

    paths = [tmp_path / "c.json", tmp_path / "c.md"]
    code = main(["certify", f"{EXAMPLES}:RowParallelReduceToRank0", "--contract", "row-parallel-linear",
                 "--world-sizes", "1", "--format", "json", *[a for p in paths for a in ("--certificate", str(p))]])
    out, err = capsys.readouterr()
    assert code == 2
    rows = json.loads(out)
    assert len(rows) == 15 and {r["verdict"] for r in rows} == {SKIP}
    assert f"{NOTHING_CAN_FAIL}: world size 1 is below 2" in err
    assert json.loads(paths[0].read_text())["verdict"] == NOTHING_CAN_FAIL
    assert "certified" not in paths[1].read_text().splitlines()[0]


@pytest.mark.multiprocess
def test_at_world_size_2_the_broken_layer_still_fails(threaded2):
    from distcheck.certify.engine import certify

    cert = certify(f"{EXAMPLES}:RowParallelReduceToRank0", "row-parallel-linear", pool=threaded2, examples=5,
                   seed=0, dtypes=["float64"])
    forward = next(v for v in cert.verdicts if v.property == "forward")
    assert forward.verdict == FAIL and cert.verdict == "FAILED" and cert.can_fail


# ---------------------------------------------------------------- distcheck check


def test_check_exits_2_when_nothing_could_fail():
    from distcheck.core.results import check_exit_code, nothing_can_fail

    skip = CheckResult("a", "gloo", SKIP, 1, 0, detail="world size 1 is below 2")
    passed = CheckResult("b", "reference", PASS, 1, 5)
    assert check_exit_code([skip, skip]) == 2 and nothing_can_fail([skip])
    assert check_exit_code([skip, passed]) == 0 and check_exit_code([]) == 0
    assert check_exit_code([skip, CheckResult("c", "gloo", FAIL, 2, 1)]) == 1
    vacuous_target = CheckResult("t r.forward[float64]", "gloo", SKIP, 1, 0, extra={"nothing_can_fail": "t: why"})
    assert check_exit_code([passed, vacuous_target]) == 2 and nothing_can_fail([passed, vacuous_target]) == ["t: why"]


@pytest.mark.multiprocess
def test_check_only_certify_at_world_size_1_exits_2_with_named_skip_rows(tmp_path, monkeypatch, capsys):
    from distcheck.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.distcheck]\nworld-sizes = [1]\nbackend = "threaded"\n\n'
        f'[[tool.distcheck.certify]]\ntarget = "{EXAMPLES}:RowParallelReduceToRank0"\n'
        'contract = "row-parallel-linear"\ndtypes = ["float64"]\n')
    code = main(["check", "--only", "certify", "--format", "json", "--quiet"])
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert code == 2 and NOTHING_CAN_FAIL in err
    assert [r["check"] for r in rows][0] == f"{EXAMPLES}:RowParallelReduceToRank0 row-parallel-linear.forward[float64]"
    assert {r["verdict"] for r in rows} == {SKIP}


# ---------------------------------------------------------------- the pytest plugin

pytest_plugins = ("pytester",)


@pytest.mark.multiprocess
def test_the_plugin_skips_a_certification_at_world_size_1(pytester, monkeypatch):
    import importlib.metadata

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setenv("PYTHONPATH", root)
    names = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    plugin = [] if "distcheck.pytest_plugin" in names else ["-p", "distcheck.pytest_plugin"]
    pytester.makepyfile(f"""
        import pytest

        from distcheck.certify import certify

        @pytest.mark.world_size(1, backend="threaded")
        def test_fixture(distcheck_certify):
            distcheck_certify("{EXAMPLES}:RowParallelReduceToRank0", "row-parallel-linear", dtypes=["float64"])
            raise AssertionError("not reached: the fixture skips")

        @pytest.mark.world_size(1, backend="threaded")
        def test_assert_certified(rank_pool):
            certify("{EXAMPLES}:RowParallelReduceToRank0", "row-parallel-linear", pool=rank_pool,
                    dtypes=["float64"]).assert_certified()
    """)
    result = pytester.runpytest_subprocess(*plugin, "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*nothing here can fail*tp = 1 shards nothing*"])


# ---------------------------------------------------------------- [tool.distcheck] targets (rows, imports)

_LAYOUT_MODULE = """
    from hypothesis import strategies as st

    from distcheck.parallel.layout.contracts import LayoutTarget

    def _groups(cfg):
        return {"tp": [[2 * i, 2 * i + 1] for i in range(cfg["dp"])]}

    LAYOUT = LayoutTarget("zz.local_layout", None, lambda: st.fixed_dictionaries({"dp": st.integers(1, 3)}),
                          _groups, _groups, lambda cfg: "tp-dp")
"""


@pytest.fixture
def local_target(tmp_path, monkeypatch):
    """A pyproject.toml in ``tmp_path`` (the current folder) whose target is a module of that folder,
    which is not on sys.path; sys.path and sys.modules are restored after."""
    name = "zz_local_layout_target"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_LAYOUT_MODULE))
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.distcheck]\n\n[[tool.distcheck.certify]]\ntarget = "{name}:LAYOUT"\ncontract = "rank-layout"\n'
        'examples = 3\n')
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.chdir(tmp_path)
    yield f"{name}:LAYOUT"
    sys.modules.pop(name, None)


def test_check_only_certify_imports_targets_from_the_current_folder_and_names_them(local_target, capsys):
    from distcheck.cli import main

    code = main(["check", "--only", "certify", "--format", "json", "--quiet"])
    rows = json.loads(capsys.readouterr().out)
    assert [(r["check"], r["verdict"]) for r in rows] == [(f"{local_target} rank-layout.groups[exact]", PASS)]
    assert code == 0


def test_certify_names_the_target_in_rows_of_tool_distcheck_targets(local_target, capsys):
    from distcheck.cli import main

    code = main(["certify", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert [(r["check"], r["verdict"]) for r in rows] == [(f"{local_target} rank-layout.groups[exact]", PASS)]
    assert code == 0
    code = main(["certify", local_target, "--contract", "rank-layout", "--examples", "3", "--format", "json"])
    assert code == 0 and [r["check"] for r in json.loads(capsys.readouterr().out)] == ["rank-layout.groups[exact]"]


def test_config_rows_always_name_the_target(local_target):
    from distcheck.certify.config import config_rows

    rows = config_rows("pyproject.toml")
    assert [r.check for r in rows] == [f"{local_target} rank-layout.groups[exact]"]
    assert "nothing_can_fail" not in rows[0].extra



def test_no_world_is_started_below_the_smallest(monkeypatch):
    """At world size 1 the tensor-parallel contract starts no pool at all: the skips are written
    without one (a world of one rank could only confirm what cannot fail)."""
    import distcheck.runners.pool as pool_module
    from distcheck.certify.engine import certify

    def refuse(*args, **kwargs):
        raise AssertionError("a pool was started below the contract's smallest world")

    monkeypatch.setattr(pool_module, "RankPool", refuse)
    cert = certify(f"{EXAMPLES}:RowParallelReduceToRank0", "row-parallel-linear", world_sizes=(1,), examples=5)
    assert cert.world_sizes == [1] and {v.verdict for v in cert.verdicts} == {SKIP} and not cert.can_fail
