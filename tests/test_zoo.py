"""The zoo of real silent bugs (distcheck.zoo, zoo/, `distcheck zoo`): discovery finds every module, every
entry's metadata is complete and its reference well formed, docs/ZOO.md is generated from the metadata, and
(slow) every bug is caught on its property while its fixed twin certifies."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from distcheck import zoo
from distcheck.cli import main
from distcheck.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "zoo"
NAMES = sorted(p.stem for p in FOLDER.glob("*.py") if not p.stem.startswith("_"))


@pytest.fixture(scope="module")
def entries():
    return zoo.discover(FOLDER)


def test_discovery_finds_every_module_of_the_folder(entries):
    assert len(NAMES) >= 25  # the floor: at least 25 public reports
    assert list(entries) == NAMES
    assert "_step" not in entries and "__init__" not in entries


def test_every_entry_is_complete_and_its_reference_well_formed(entries):
    from distcheck.certify import get_contract

    for name, e in entries.items():
        zoo.check_entry(name, e)
        contract = get_contract(e.contract)
        assert e.property in {p.name for p in contract.properties}, (name, e.property)
        m = zoo.GITHUB_REF.match(e.reference)
        assert m or zoo.TEXT_REF.match(e.reference), (name, e.reference)
        if m:  # the public page of the number cited, in the repository cited
            assert e.url.startswith(f"https://github.com/{m['repo']}/"), name
            assert e.url.rsplit("/", 1)[1] == m["n"], name


@pytest.mark.parametrize(("field", "value", "rule"), [
    ("reference", "torchtitan 596", "owner/repo#N"),
    ("reference", "pytorch/torchtitan#0", "owner/repo#N"),
    ("url", "https://github.com/pytorch/pytorch/issues/596", "the reference's page"),
    ("bug_class", " ", "non-empty"),
    ("reproduction", "guessed", "must be one of"),
    ("world_size", 1, ">= 2"),
])
def test_an_incomplete_or_malformed_entry_is_refused_naming_the_field(entries, field, value, rule):
    good = entries["torchtitan_596_pp_clip_stage_norm"]
    with pytest.raises(ConfigError, match=rule) as info:
        zoo.check_entry("x", replace(good, **{field: value}))
    assert field in str(info.value)


def test_the_fixed_twin_must_differ_from_the_bug(entries):
    good = entries["torchtitan_596_pp_clip_stage_norm"]
    with pytest.raises(ConfigError, match="two different targets"):
        zoo.check_entry("x", replace(good, fixed=good.bug))


def test_docs_zoo_table_is_the_metadata(entries):
    text = (ROOT / "docs" / "ZOO.md").read_text()
    begin, end = "<!-- zoo table: distcheck zoo --list -->\n", "<!-- end zoo table -->"
    assert begin in text and end in text
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == zoo.metadata_markdown(entries)


def _readme_zoo_table() -> str:
    import re

    found = re.search(r"\| entry \| reference \| bug class \|.*?\n(?=\n)", (ROOT / "README.md").read_text(), re.S)
    assert found is not None, "README.md has no zoo table"
    return found.group(0)


def test_readme_zoo_table_is_a_green_run_of_every_entry(entries):
    """The README's table (CI compares it with a real `distcheck zoo --format markdown`) lists every entry, with its
    reference linked, as caught with its twin certified: the markdown of a run where every row is green."""
    green = [zoo.ZooRow(n, e, caught=True, certified=True) for n, e in entries.items()]
    assert _readme_zoo_table() == zoo.to_markdown(green)
    n = len(entries)  # the count stated beside the anchors' figures
    prose = " ".join((ROOT / "README.md").read_text().split())
    assert f"distcheck's zoo: {n} public reports, {n} of {n} caught by the property named" in prose
    assert "TTrace finds 14 of 14" in prose and "detects 18 of 20" in prose


def test_only_property_narrows_a_copy_of_the_contract():
    from distcheck.certify import get_contract

    contract = get_contract("training-step")
    narrowed = zoo.only_property(contract, "grad_norm")
    assert [p.name for p in narrowed.properties] == ["grad_norm"]
    assert narrowed.name == contract.name and type(narrowed) is type(contract)
    assert [p.name for p in get_contract("training-step").properties] == [  # the registry's contract untouched
        "params", "loss", "grad_norm", "clipping", "tokens"]
    with pytest.raises(ConfigError, match="property='gradnorm' must be a property of the contract 'training-step'"):
        zoo.only_property(contract, "gradnorm")


def test_run_entry_refuses_a_pool_of_another_world_size(entries):
    class FourRanks:
        world_size = 4

    with pytest.raises(ConfigError, match="must have the entry's world_size=2 ranks"):
        zoo.run_entry("ramtorch_13_zero1_params_not_broadcast", entries["ramtorch_13_zero1_params_not_broadcast"],
                      pool=FourRanks())


def test_cli_refuses_an_unknown_entry_with_exit_2(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["zoo", "--entry", "no_such_entry"]) == 2
    err = capsys.readouterr().err
    assert "--entry" in err and "no_such_entry" in err


def test_cli_list_prints_every_entry_without_running(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["zoo", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"| {n} |" in out for n in NAMES)


def test_a_missing_library_is_a_skip_and_fails_the_run_unless_allowed(entries):
    e = replace(entries["accelerate_ga_mean_loss"], requires=("no_such_module_xyz",))
    row = zoo.run_entry("x", e)
    assert row.caught is None and row.certified is None and not row.ok
    assert "no_such_module_xyz" in row.skip


def _runnable(e: zoo.Entry) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in e.requires)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", NAMES)
def test_each_bug_is_caught_on_its_property_and_its_twin_certifies(entries, name):
    e = entries[name]
    if not _runnable(e):
        pytest.skip(f"needs {', '.join(e.requires)} (pip install 'distcheck[libs]')")
    row = zoo.run_entry(name, e)
    assert row.caught, row.detail
    assert row.certified, row.detail


@pytest.mark.slow
@pytest.mark.multiprocess
def test_entries_share_one_pool_and_the_bug_run_checks_its_property_alone(entries):
    """Two entries on one world of two ranks, started once; the bug's verdict is its named property's, the twin's
    every property's."""
    from distcheck.runners.pool import RankPool

    names = ["ramtorch_13_zero1_params_not_broadcast", "torchtitan_1733_pp_scale_grads"]
    with RankPool(2, backend="gloo", timeout_s=zoo.TIMEOUT_S) as pool:
        rows = [zoo.run_entry(n, entries[n], pool=pool) for n in names]
        assert pool.generation == 1 and pool.running  # never restarted, left open for the next entry
    assert all(r.ok for r in rows), [r.detail for r in rows]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_bug_that_passes_its_property_is_not_caught_and_says_so(entries):
    """The twin in the bug's place: its named property passes, so the row is not caught, with the verdict named."""
    e = entries["ramtorch_13_zero1_params_not_broadcast"]
    e = replace(e, bug=e.fixed)  # a string: the same target, not the same object

    row = zoo.run_entry("x", e)
    assert row.caught is False and row.certified is True and not row.ok
    assert row.detail.startswith("params pass on "), row.detail


@pytest.mark.slow
@pytest.mark.multiprocess
def test_cli_runs_one_entry_and_exits_0_when_caught_and_certified(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["zoo", "--entry", "torchtune_2420_tp_clip_replicated", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"caught": true' in out and '"twin_certified": true' in out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_cli_exits_1_when_a_bug_is_not_caught(tmp_path, capsys, monkeypatch):
    """An entry whose 'bug' is the fixed composition itself: nothing fails, so the zoo must exit 1."""
    folder = tmp_path / "zoo"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "not_a_bug.py").write_text(
        "from distcheck.zoo import Entry\n"
        "from distcheck.parallel.step.hooks import StepTarget\n"
        "from examples.my_step import parallelize\n"
        "ENTRY = Entry(reference='pytorch/torchtitan#596', url='https://github.com/pytorch/torchtitan/issues/596',\n"
        "    library='x', versions='x', bug_class='x', contract='training-step', property='grad_norm',\n"
        "    bug=StepTarget(parallelize), fixed=StepTarget(parallelize), summary='x',\n"
        "    reproduction='plain torch re-creation', options={'layout': 'tp=2'}, examples=2)\n")
    monkeypatch.syspath_prepend(str(ROOT))
    assert main(["zoo", "--dir", str(folder)]) == 1
    assert "NO" in capsys.readouterr().out
