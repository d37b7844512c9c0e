"""The one-line messages of the command line: what they name, so that a user can act on them.

A bad ``[[tool.distcheck.certify]]`` entry is named by its file, its number and its target; an unknown
contract or option suggests the close name and lists the known ones; an unknown flag of a subcommand
points to that subcommand's help; ``distcheck check`` says plainly when the certify stage had nothing to run.
"""

from __future__ import annotations

import json

import pytest

from distcheck.cli import main

_TWO_ENTRIES = ('[tool.distcheck]\n\n[[tool.distcheck.certify]]\ntarget = "pkg.layers:Column"\n'
                'contract = "column-parallel-linear"\n\n[[tool.distcheck.certify]]\ntarget = "pkg.layers:Row"\n'
                'contract = "{contract}"\n{extra}')


def _main(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as exc:  # argparse's own errors exit from parse_args
        return int(exc.code or 0)


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder with a pyproject.toml of two entries, the second naming ``contract`` (and ``extra`` lines)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "pyproject.toml"

    def write(contract: str, extra: str = "") -> str:
        path.write_text(_TWO_ENTRIES.format(contract=contract, extra=extra))
        return str(path)

    return write


@pytest.mark.parametrize("command", [["certify"], ["check", "--only", "certify", "--format", "json"]])
def test_an_unknown_contract_in_pyproject_names_the_file_the_entry_and_the_close_name(project, capsys, command):
    path = project("row-paralel-linear")
    assert _main(*command) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"distcheck: error: {path}: [[tool.distcheck.certify]] #2 (target 'pkg.layers:Row'): "
                           "unknown contract 'row-paralel-linear'; did you mean row-parallel-linear"), line


def test_an_unknown_contract_with_no_close_name_lists_the_known_ones(project, capsys):
    path = project("zzzq")
    assert _main("certify") == 2
    line = _one_error_line(capsys)
    assert f"{path}: [[tool.distcheck.certify]] #2 (target 'pkg.layers:Row'): unknown contract 'zzzq' (known: " in line
    assert "did you mean" not in line
    assert "column-parallel-linear" in line and "row-parallel-linear" in line and "training-step" in line


def test_an_unknown_option_in_pyproject_names_the_entry_and_the_contracts_options(project, capsys):
    path = project("column-parallel-linear", "options = { gather_ouptut = false }\n")
    assert _main("certify") == 2
    line = _one_error_line(capsys)
    assert line == (f"distcheck: error: {path}: [[tool.distcheck.certify]] #2 (target 'pkg.layers:Row'): unknown "
                    "option of contract column-parallel-linear 'gather_ouptut'; did you mean gather_output? "
                    "(known: divisible, gather_output, kwargs, param_names, split)")


def test_config_rows_name_the_file_of_a_bad_entry(project):
    # the rows of `distcheck check`'s certify stage: its FAIL row's detail is this message
    from distcheck.certify.config import config_rows
    from distcheck.core.errors import UnknownQuantityError

    path = project("row-paralel-linear")
    with pytest.raises(UnknownQuantityError) as info:
        config_rows(path)
    assert str(info.value).startswith(f"{path}: [[tool.distcheck.certify]] #2 (target 'pkg.layers:Row'): ")


@pytest.mark.parametrize("option, expected", [
    ("gather_ouptut=false", "unknown option of contract column-parallel-linear 'gather_ouptut'; did you mean "
                            "gather_output? (known: divisible, gather_output, kwargs, param_names, split)"),
    ("zzz=1", "unknown option of contract column-parallel-linear 'zzz' "
              "(known: divisible, gather_output, kwargs, param_names, split)"),
])
def test_an_unknown_option_flag_suggests_the_close_name_and_lists_the_options(tmp_path, monkeypatch, capsys,
                                                                             option, expected):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml of this project's own
    assert _main("certify", "pkg.layers:Column", "--contract", "column-parallel-linear", "--option", option) == 2
    assert _one_error_line(capsys) == f"distcheck: error: {expected}"


def test_an_unknown_option_of_a_contract_with_no_options_says_so():
    from distcheck.core.errors import UnknownQuantityError

    err = UnknownQuantityError("x", [], kind="option of contract c", list_known=True)
    assert str(err) == "unknown option of contract c 'x' (there are none)"


@pytest.mark.parametrize("argv, prog, unknown", [
    (["certify", "--exmples", "3"], "distcheck certify", "--exmples"),
    (["plan", "memory", "--gpus", "8", "--bogus"], "distcheck plan memory", "--bogus"),
    (["check", "--bogus"], "distcheck check", "--bogus"),
    (["--bogus", "check"], "distcheck", "--bogus"),  # before the subcommand: the top level's own
])
def test_an_unknown_flag_points_to_the_help_of_the_command_it_was_given_to(argv, prog, unknown, capsys):
    assert _main(*argv) == 2
    assert _one_error_line(capsys) == f"{prog}: error: unrecognized arguments: {unknown} (see '{prog} --help')"


@pytest.mark.parametrize("pyproject, reason", [
    ('[tool.distcheck]\nprofile = "ci"\n', "nothing to certify (no [[tool.distcheck.certify]] entries in "
                                           "./pyproject.toml)"),
    (None, "nothing to certify (no pyproject.toml in the current folder)"),
])
def test_check_says_the_certify_stage_had_nothing_to_run(tmp_path, monkeypatch, capsys, pyproject, reason):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")  # one log line per stage
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    assert _main("check", "--only", "certify", "--format", "json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == []
    said = " ".join(err.split())
    assert f"certify targets of pyproject.toml: {reason}" in said, err
    assert "0 checks" not in said
