"""Output that reads in a CI log (off a terminal): whole check names, one crash reported once, reproduce
lines that name their own row's world size and backend, the ranks' warnings summarised once."""

from __future__ import annotations

import io

from rich.console import Console

from distcheck.core.results import FAIL, FINDING, PASS, CheckResult
from distcheck.report import render_table

LONG = "row-parallel-linear.collectives.forward_and_backward_of_a_long_name[float64]"


def _log(width: int = 200) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=width, color_system=None), out


def test_off_a_terminal_the_table_never_cuts_a_check_name():
    rows = [CheckResult(LONG, "gloo", PASS, 2, 10, detail="outputs match " + "x" * 300),
            CheckResult("tp.short", "gloo", FAIL, 4, 3, detail="bad " + "y" * 300)]
    for width in (200, 120, 90):  # the table, a narrower one, the one-line form
        console, out = _log(width)
        render_table(rows, console=console)
        lines = out.getvalue().splitlines()
        assert any(LONG in line for line in lines), (width, out.getvalue())
        assert all(len(line) <= width for line in lines), width
    # on a terminal the name gives way to the detail, cut in the middle
    out = io.StringIO()
    render_table(rows, console=Console(file=out, force_terminal=True, width=120, color_system=None))
    assert LONG not in out.getvalue() and "…" in out.getvalue()


# ----------------------------------------------------------------------------- reproduce lines

#: the worlds the rows of a world check come from (check prefix -> (world size, backend) pairs); the rows of
#: every other finding are world-free
WORLD_ROWS = {"pp.executed_order.": [(2, "gloo"), (4, "gloo"), (4, "threaded")],
              "checkpoint.fsdp_tp.": [(4, "gloo"), (8, "threaded")],
              "libs.accelerate.ga_mean_loss.": [(2, "accelerate"), (4, "accelerate")]}


def _reproduce_lines(text: str) -> list[tuple[str, int, str]]:
    """(backend, world size, reproduce line) for every reproduce line below a FAIL or finding header."""
    import re

    out, head = [], None
    for line in text.splitlines():
        m = re.match(r"(?:FAIL|finding) \S+ \((\S+), world size (\d+)\):$", line)
        if m:
            head = (m.group(1), int(m.group(2)))
        elif line.startswith("  reproduce: ") and head is not None:
            out.append((head[0], head[1], line.removeprefix("  reproduce: ")))
    return out


def test_every_reproduce_line_names_the_world_of_its_own_row():
    import re

    from distcheck.engine.findings import known_findings
    from distcheck.libs.findings import LIB_FINDINGS

    rows = []
    for f in (*known_findings(), *LIB_FINDINGS):
        worlds = next((w for prefix, w in WORLD_ROWS.items() if f.check.startswith(prefix)), [(1, "reference")])
        for ws, backend in worlds:
            row = CheckResult(f.check, backend, FINDING, ws, 1, detail="observed",
                              extra={"finding": dict(vars(f), reproduce=f.reproduce_for(
                                  CheckResult(f.check, backend, FAIL, ws)))})
            rows.append(row)
    console, out = _log()
    render_table(rows, console=console)
    lines = _reproduce_lines(out.getvalue())
    assert len(lines) == len(rows)
    commands = 0
    for backend, ws, line in lines:
        for command in re.findall(r"distcheck (?:check|certify) [^#;]*", line):
            sizes = re.findall(r"--world-sizes (\S+)", command)
            named = re.findall(r"--backend (\S+)", command)
            if backend == "reference":  # a world-free row: no world to name
                assert not sizes and not named, line
                continue
            commands += 1
            assert sizes == [str(ws)], (ws, line)  # its own world size, once
            expected = "gloo" if backend == "accelerate" else backend  # distcheck libs runs on gloo
            assert named == [expected], (backend, line)
    assert commands == 3 + 2 + 4 * 2  # every world row (4 accelerate findings) has a command naming its world


def test_a_labelled_finding_records_the_reproduce_line_of_its_row():
    from distcheck.engine.findings import Finding, label_findings

    f = Finding(name="x.y", check="pp.executed_order.X", symptom="bad", summary="s", library="torch",
                seen_on=("1",), reproduce="distcheck check --only layers --world-sizes {world_size} --backend "
                                          "{backend}", reported="r")
    rows = [CheckResult("pp.executed_order.X", b, FAIL, ws, detail="bad") for ws, b in ((2, "gloo"), (4, "threaded"))]
    got = label_findings(rows, [f], versions={"torch": "1"})
    assert [r.extra["finding"]["reproduce"] for r in got] == [
        "distcheck check --only layers --world-sizes 2 --backend gloo",
        "distcheck check --only layers --world-sizes 4 --backend threaded"]


# ----------------------------------------------------------------------------- one crash, one failure


def _crashing_add(a, b):
    raise RuntimeError("the adder fell over")


def test_one_crash_is_one_failure_in_every_report_and_every_property_still_fails(tmp_path):
    import json

    import pytest

    from distcheck.certify.certificate import Certificate
    from distcheck.certify.engine import certify
    from distcheck.certify.report import report_tables
    from distcheck.engine.contracts.errors import CertificationFailed
    from tests.addition_contract import AdditionContract

    class CrashContract(AdditionContract):
        name = "test-log-crash"
        dtypes = ("float64", "float32")

    cert = certify(_crashing_add, CrashContract(), examples=5, seed=0)
    # honest: every property of every dtype FAILs, each naming the crash and the properties it took down
    assert [(v.property, v.verdict, v.took_down) for v in cert.verdicts] == [
        (p, FAIL, ["sum", "symmetric"]) for _ in ("float64", "float32") for p in ("sum", "symmetric")]
    data = json.loads(Certificate([cert], command="c").to_json())
    assert [v["verdict"] for v in data["certifications"][0]["verdicts"]] == [FAIL] * 4
    assert all("the adder fell over" in v["failure"] for v in data["certifications"][0]["verdicts"])

    console, out = _log()
    render_table(cert.rows(), console=console)
    text = out.getvalue()
    assert text.count("the adder fell over") == 2, text  # once per crash (one per dtype), not once per property
    assert ("one crash took down 2 checks: test-log-crash.sum[float64], test-log-crash.symmetric[float64]"
            in text)
    assert "taken down by the crash of test-log-crash.sum[float32]" in text  # the table's second row

    from distcheck.certify.config import target_rows

    named = target_rows(cert)  # [tool.distcheck] targets: every check named after its target, the crash's too
    assert named[0].extra["took_down"] == [f"{cert.target} test-log-crash.sum[float64]",
                                           f"{cert.target} test-log-crash.symmetric[float64]"]
    console, out = _log()
    render_table(named, console=console)
    assert out.getvalue().count("the adder fell over") == 2

    with pytest.raises(CertificationFailed) as info:
        cert.assert_certified()
    assert str(info.value).count("the adder fell over") == 2
    assert Certificate([cert], command="c").to_markdown().count("the adder fell over") == 2

    tables = {t.title: t for t in report_tables(Certificate([cert], command="c"))}
    (failure,) = tables["Failures, one row per property"].rows  # one crash per dtype, one row for both
    assert failure[2] == "test-log-crash.sum, test-log-crash.symmetric"
    assert failure[4].startswith("one crash took down 2 properties: rank 0 raised RuntimeError")


# ----------------------------------------------------------------------------- the ranks' warnings


def _warn(ctx):
    """A rank that warns as torch's DTensor does (a logged WARNING) and as Python code does (warnings.warn)."""
    import logging
    import warnings

    logging.getLogger("torch.distributed.tensor._redistribute").warning("While redistributing: %d sequential ops", 2)
    warnings.warn("a rank's careful-now warning", UserWarning, stacklevel=1)
    return ctx.rank


def test_the_ranks_warnings_are_collected_and_summarised_once_never_on_stderr(capfd):
    import pytest

    from distcheck.report import print_rank_warnings
    from distcheck.runners import warned
    from distcheck.runners.pool import RankPool

    pytest.importorskip("torch")
    warned.take()
    for backend in ("gloo", "threaded"):
        with RankPool(2, backend=backend, timeout_s=60) as pool:
            for _ in range(2):
                assert pool.run(_warn) == [0, 1]
    out, err = capfd.readouterr()
    assert "While redistributing" not in err and "careful-now" not in err, err  # nothing between progress lines
    print_rank_warnings()
    err = capfd.readouterr().err.splitlines()
    blocks = {line: err[i + 1:i + 2] for i, line in enumerate(err) if not line.startswith("  ")}
    assert len(err) == 4 and len(blocks) == 2, err  # one header and one distinct warning per source
    # the logged warning every time (2 steps x 2 ranks x 2 worlds); Python's default filter shows a warning once
    # per place and process: once per gloo rank, once in the threaded host
    (logged,) = blocks["torch warned 8 times on the ranks (ranks 0, 1):"]
    assert logged.startswith("  8x tests/test_log_output.py:"), err  # where the logger was called
    assert logged.endswith(": logged WARNING: While redistributing: 2 sequential ops"), err
    (warned_once,) = blocks["tests warned 3 times on the ranks (ranks 0, 1):"]
    assert warned_once.startswith("  3x tests/test_log_output.py:"), err
    assert warned_once.endswith(": UserWarning: a rank's careful-now warning"), err
    print_rank_warnings()  # shown once: taken
    assert capfd.readouterr().err == ""


def test_under_an_error_filter_a_ranks_warning_still_fails_its_step():
    import warnings

    import pytest

    from distcheck.core.errors import RankFailure
    from distcheck.runners.pool import RankPool

    pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as python -W error does; the forked ranks inherit the filter
        with RankPool(2, backend="gloo", timeout_s=60) as pool, pytest.raises(RankFailure) as info:
            pool.run(_warn)
    assert "UserWarning: a rank's careful-now warning" in str(info.value)
