"""``distcheck plan`` and ``--report``: exit codes, one-line errors, the lesson's answer, files written, imports."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from distcheck.cli import main

mpl_image = pytest.importorskip("matplotlib.image")

LESSON = ["plan", "memory", "--model", "lesson-70b-style", "--gpus", "16", "--gpu-memory", "80GB"]


def _code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse errors exit through the parser
        return exc.code


def test_plan_memory_reproduces_the_lesson_on_16_gpus(capsys):
    assert main(LESSON + ["--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ddp_state_bytes"] == 1_103_605_268_480
    assert data["smallest_tp_pp_before_activations"] == {"tp": 8, "pp": 2, "state_bytes": 68_975_329_280}
    assert [q["answer"] for q in data["questions"]][:4] == [False, False, False, True]
    assert data["recommended"]["layout"] == {"tp": 8, "pp": 2, "dp": 1, "cp": 1, "zero": 0}
    assert data["recommended"]["bytes"]["total"] == 68_975_329_280 + 5_704_253_440
    assert len(data["layouts"]) == 124
    assert any("mixed_adamw = 2 weights + 2 gradients + 12 optimizer = 16 B/param" in c for c in data["conventions"])


def test_plan_memory_table_names_the_lesson_conclusions(capsys):
    assert main(LESSON) == 0
    out = capsys.readouterr().out
    assert "DDP keeps the whole state on every GPU, 1,103.61 GB per GPU: does not fit 80.00 GB" in out
    assert "smallest TP × PP split that fits before activations (ZeRO-0): TP 8 × PP 2, 68.98 GB" in out
    assert "Recommendation: TP 8 × PP 2 × DP 1, ZeRO-0 (question 4)" in out
    assert "layouts, ranked (15 of 124)" in out


def test_an_explicit_layout_gives_its_breakdown_and_its_fit_as_exit_code(capsys):
    argv = ["plan", "memory", "--model", "llama3-70b", "--gpus", "64", "--gpus-per-node", "8", "--gpu-memory", "80GB",
            "--seq-len", "8192", "--micro-batch", "1"]
    assert main(argv + ["--tp", "8", "--pp", "2", "--zero", "1", "--dp", "4", "--format", "json"]) == 0
    e = json.loads(capsys.readouterr().out)["estimate"]
    p = 70_553_706_496 // 16
    assert e["bytes"]["weights"] == 2 * p and e["bytes"]["gradients"] == 2 * p and e["bytes"]["optimizer"] == 3 * p
    assert e["bytes"]["activations"] == 34 * 8192 * 8192 // 8 * 40 * 2
    assert main(argv + ["--tp", "8", "--pp", "2"]) == 1  # DP 4 without ZeRO: 141 GB of state
    assert "does NOT fit 80.00 GB" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--model", "lesson-70b-style", "--gpus", "16", "--tp", "3"], "tp=3 must divide num_heads=64"),
    (["--model", "lesson-70b-style", "--gpus", "16", "--tp", "8", "--dp", "3"], "gpus=16 must equal tp*cp*pp*dp"),
    (["--model", "lesson-70b-style", "--gpus", "12"], "gpus=12 must be a multiple of gpus_per_node=8"),
    (["--model", "llama-3-405b", "--gpus", "8", "--gpu-memory", "16GB"], "cannot fit 8 GPUs of 16.00 GB in any layout"),
    (["--model", "gpt-9", "--gpus", "8"], "model='gpt-9' is not a preset"),
    (["--model", "gpt-9", "--gpus", "8"], "MoE: deepseek-v3, mixtral-8x7b; case and punctuation are ignored"),
    (["--gpus", "8"], "model=None is required"),
    (["--model", "llama-3-8b", "--gpus", "8", "--gpu-memory", "lots"], "gpu_memory='lots' must be a number"),
    (["--model", "llama-3-8b", "--gpus", "8", "--figure", "x.pdf"], "must end in .png or .svg"),
    (["--model", "llama-3-8b", "--gpus", "8", "--report", "/nonexistent/dir/r"], "cannot be created"),
    (["--model", "llama-3-8b", "--gpus", "x"], "invalid int value"),
    (["--model", "llama-3-8b"], "the following arguments are required: --gpus"),
    (["--params=1e400", "--gpus", "8"], "params=1.000000e+400 must be <= 1000000000000000000"),
    (["--params", "7e9", "--gpus", "8", "--gpu-memory=-80GB"], "gpu_memory='-80GB' must not be negative"),
])
def test_bad_plan_input_is_one_line_and_exit_2(argv, message, capsys):
    assert _code(["plan", "memory", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plan_pipeline_prints_the_timeline_and_checks_the_closed_forms(capsys, tmp_path):
    fig = tmp_path / "gantt.svg"
    assert main(["plan", "pp", "--p", "4", "--m", "4", "--schedule", "gpipe", "--figure", str(fig)]) == 0
    out = capsys.readouterr().out
    assert "rank 3 |.  .  .  F0 F1 F2 F3 B0 B0" in out
    assert "bubble fraction (idle / total): 3/7 = 42.86%" in out and "idle per rank: 9, 9, 9, 9 ticks" in out
    assert out.count("pass    pp.") == 5
    ids = [el.get("id") for el in ET.parse(fig).getroot().iter() if el.get("id")]
    assert sum(i.startswith("idle-") for i in ids) == 36
    assert _code(["plan", "pp", "--p", "2", "--m", "3", "--schedule", "interleaved"]) == 2
    assert "m=3 must be a multiple of p=2" in capsys.readouterr().err


@pytest.mark.slow
def test_plan_pipeline_torch_reports_the_known_1f1b_table_finding(capsys):
    pytest.importorskip("torch")
    assert main(["plan", "pp", "--p", "2", "--m", "2", "--torch"]) == 0
    out = capsys.readouterr().out
    assert "finding pp.table.Schedule1F1B: recorded finding torch.Schedule1F1B.table_last_rank" in out
    assert "rank 1 | 1F1 1B0 1F2 1B1" in out  # torch's table names micro-batch 2 of 2
    assert main(["plan", "pp", "--p", "2", "--m", "4", "--torch", "ScheduleGPipe", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["torch"]["timeline"]["step_ticks"] == data["simulator"]["step_ticks"] == 15
    assert {c["verdict"] for c in data["checks"]} == {"pass"}


def test_torch_schedule_names_match_the_runner():
    pytest.importorskip("torch")
    from distcheck.parallel.pp.tables import TORCH_SCHEDULES as SCHEDULES
    from distcheck.plan.cli import TORCH_SCHEDULES

    assert TORCH_SCHEDULES == tuple(SCHEDULES)


def test_plan_layout_lists_groups_and_draws_them(capsys, tmp_path):
    png = tmp_path / "mesh.png"
    assert main(["plan", "layout", "--tp", "2", "--pp", "2", "--dp", "4", "--figure", str(png)]) == 0
    out = capsys.readouterr().out
    assert "tp: 8 groups of 2, each inside a node\n  [0,1] [2,3]" in out
    assert "dp: 4 groups of 4, crossing nodes\n  [0,4,8,12] [1,5,9,13]" in out
    assert mpl_image.imread(str(png)).shape[0] > 100
    # 128 ranks: too many to draw
    assert _code(["plan", "layout", "--tp", "8", "--dp", "16", "--figure", str(png)]) == 2


def test_plan_memory_report_has_the_chart_the_diagram_and_the_tables(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(LESSON + ["--report", str(out), "--figure", str(tmp_path / "m.png")]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["report-layout.png", "report-memory.png", "report.html",
                                                     "report.md"]
    html = (out / "report.html").read_text()
    assert html.count("<table") == 2 and html.count("data:image/png;base64,") == 2
    assert "Recommendation: TP 8 × PP 2 × DP 1, ZeRO-0" in html
    md = (out / "report.md").read_text()
    assert "## Every valid layout, ranked" in md and md.count("\n| ") >= 124
    assert mpl_image.imread(str(tmp_path / "m.png")).shape[1] > 300


def test_check_and_audit_write_reports(tmp_path, capsys):
    assert main(["check", "--only", "golden", "--report", str(tmp_path / "c"), "--quiet"]) == 0
    html = (tmp_path / "c" / "report.html").read_text()
    assert html.count("<tr>") > 100 and "passed, 0 failed" in html
    assert main(["audit", "golden/zero_paper.toml", "--report", str(tmp_path / "a")]) == 0
    md = (tmp_path / "a" / "report.md").read_text()
    assert "| claim | quantity | printed | recomputed | verdict | explanation |" in md and "zero_paper.toml" in md
    (tmp_path / "file").write_text("")
    assert main(["check", "--only", "golden", "--report", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_import_distcheck_and_check_do_not_import_matplotlib(tmp_path):
    code = ("import sys; import distcheck, distcheck.cli, distcheck.plan, distcheck.viz, distcheck.reportdoc; "
            "from distcheck.cli import build_parser; build_parser(); "
            "assert 'matplotlib' not in sys.modules and 'torch' not in sys.modules and 'sympy' not in sys.modules; "
            "from distcheck.cli import main; "
            f"rc = main(['check', '--only', 'golden', '--report', {str(tmp_path / 'r')!r}]); "
            "assert rc == 0; assert 'matplotlib' not in sys.modules, 'check imported matplotlib'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


def test_figure_without_matplotlib_is_bad_input(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; from distcheck.cli import main; "
            f"sys.exit(main(['plan', 'pipeline', '--p', '2', '--m', '2', '--figure', {str(tmp_path / 'g.png')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "pip install 'distcheck[plot]'" in proc.stderr
    assert not (tmp_path / "g.png").exists()


def test_plan_help_documents_the_options(capsys):
    for argv, words in ((["plan", "--help"], ["memory", "pipeline", "layout", "Exit codes"]),
                        (["plan", "memory", "--help"], ["--model", "--gpus", "--gpu-memory", "--tp", "--zero",
                                                        "--recompute", "--figure", "--report", "--quiet"]),
                        (["plan", "pp", "--help"], ["--p", "--m", "--schedule", "--torch", "--figure"]),
                        (["check", "--help"], ["--report", "--quiet"]), (["audit", "--help"], ["--report"])):
        assert _code(argv) == 0
        out = capsys.readouterr().out
        assert all(w in out for w in words), (argv, [w for w in words if w not in out])


def test_the_old_name_plan_pipeline_still_runs_with_a_note(capsys):
    # one name per parallelism: `plan pp`; the old `plan pipeline` works for one release and says so
    assert main(["plan", "pipeline", "--p", "2", "--m", "2", "--format", "json"]) == 0
    old = capsys.readouterr()
    assert "'plan pipeline' is deprecated: use 'plan pp'" in old.err
    assert main(["plan", "pp", "--p", "2", "--m", "2", "--format", "json"]) == 0
    new = capsys.readouterr()
    assert new.err == "" and new.out == old.out


def test_plan_memory_states_its_ranking_key_above_the_table_and_sort_chooses_another(capsys):
    assert main(LESSON) == 0
    out = capsys.readouterr().out
    key = "Ranked by lesson (--sort): layouts that fit first; then the lesson's question (simplest strategy first)"
    assert key in out and out.index(key) < out.index("layouts, ranked (15 of 124)")
    for by, value in (("memory", lambda e: e["bytes"]["total"]), ("comm", lambda e: e["comm_total"]),
                      ("bubble", lambda e: e["bubble_fraction"])):
        assert main(LESSON + ["--sort", by, "--format", "json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["sort"]["by"] == by and data["sort"]["rule"].startswith("layouts that fit first; then the")
        from fractions import Fraction

        def exact(x):  # an int, or {"exact": "p/q", "approx": ...}
            return Fraction(x["exact"]) if isinstance(x, dict) else Fraction(x)

        keys = [(not e["fits"], exact(value(e))) for e in data["layouts"]]
        assert keys == sorted(keys) and len(keys) == 124, by
        assert data["recommended"]["layout"] == {"tp": 8, "pp": 2, "dp": 1, "cp": 1, "zero": 0}  # the lesson's
    assert main(LESSON + ["--sort", "memory", "--top", "3"]) == 0
    assert "Ranked by memory (--sort): layouts that fit first; then the fewest bytes per GPU" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--sort", "speed"], "invalid choice: 'speed'"),
    (["--sort", "memory", "--tp", "8", "--pp", "2"], "--sort='memory' orders the table of every layout"),
    (["--sort", "comm", "--model", "mixtral-8x7b"], "--sort='comm' applies to dense layouts"),
])
def test_plan_memory_sort_is_validated(capsys, argv, message):
    assert _code(LESSON + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_sort_estimates_refuses_an_unknown_order():
    from distcheck.core.errors import ConfigError
    from distcheck.plan import sort_estimates

    with pytest.raises(ConfigError, match="sort='fast' must be one of"):
        sort_estimates([], "fast")


def test_the_plan_report_states_its_questions_once(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(LESSON + ["--report", str(out)]) == 0
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert text.count("Does the whole training state fit one GPU (DDP)?") == 1, name
        assert text.count("Does it fit with TP inside each node and PP across nodes?") == 1, name


def test_plan_memory_labels_a_tp_layout_without_pp_tp_alone(capsys):
    assert main(LESSON + ["--format", "json"]) == 0
    layouts = json.loads(capsys.readouterr().out)["layouts"]
    labels = {(e["layout"]["tp"], e["layout"]["pp"], e["layout"]["dp"], e["layout"]["zero"]): e["question_label"]
              for e in layouts if e["layout"]["cp"] == 1}
    assert labels[(8, 1, 2, 3)] == "4 (TP alone)" and labels[(8, 2, 1, 0)] == "4" and labels[(1, 1, 16, 3)] == "3"
    assert main(LESSON + ["--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "│ 4 (TP alone) │" in out  # the second-ranked layout: TP 8 × DP 2, ZeRO-3
