"""The HTML report in a real headless browser (Debian's chromium): it loads offline with no error,
every table is in the DOM, and every image decodes to its stated size.

Skipped where chromium is not installed, unless DISTCHECK_REQUIRE_BROWSER=1 (CI sets it), which turns
the skip into a failure so CI cannot pass without having run the browser.

How: the test copies the report, allows inline scripts in its Content-Security-Policy, and adds two
probes: one at the top of <head> that records CSP violations and load errors, one that, at the window's
``load`` event, writes what it saw (each image's ``complete``, ``naturalWidth`` and ``naturalHeight``,
the table captions and row counts) into a <pre id="distcheck-probe">. Chromium's ``--dump-dom`` prints
the DOM after load; the test reads the probe back. The same probe run on a page with a blocked external
image and a corrupt one must report both: the check can fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from distcheck.cli import main

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")

if BROWSER is None:
    if os.environ.get("DISTCHECK_REQUIRE_BROWSER") == "1":
        pytest.fail("DISTCHECK_REQUIRE_BROWSER=1 but chromium is not installed", pytrace=False)
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)

pytest.importorskip("matplotlib")

_HEAD_PROBE = """<script>
window.__violations = []; window.__errors = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " " + e.blockedURI);
});
window.addEventListener("error", function (e) {
  window.__errors.push(String(e.message || (e.target && e.target.src) || "error"));
}, true);
</script>"""
_LOAD_PROBE = """<script>
window.addEventListener("load", function () {
  var tables = Array.prototype.map.call(document.querySelectorAll("table"), function (t) {
    return {caption: t.caption ? t.caption.textContent : null, rows: t.tBodies[0] ? t.tBodies[0].rows.length : 0};
  });
  var images = Array.prototype.map.call(document.images, function (i) {
    return {complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
            stated: [i.getAttribute("width"), i.getAttribute("height")]};
  });
  var out = document.createElement("pre"); out.id = "distcheck-probe";
  out.textContent = JSON.stringify({tables: tables, images: images, violations: window.__violations,
                                    errors: window.__errors});
  document.body.appendChild(out);
});
</script>"""


def _probe(html: str, tmp_path, extra_body: str = "") -> tuple[dict, str]:
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', html)
    assert csp and "default-src 'none'" in csp.group(1)
    scripts_allowed = csp.group(0).replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';")
    page = html.replace(csp.group(0), scripts_allowed + _HEAD_PROBE, 1)
    page = page.replace("</body>", extra_body + _LOAD_PROBE + "</body>", 1)
    path = tmp_path / "probe.html"
    path.write_text(page)
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
           "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=10000", "--dump-dom", path.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="distcheck-probe">(.*?)</pre>', proc.stdout, re.DOTALL)
    assert found, "the load probe did not run: " + proc.stderr[-2000:]
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]
    return json.loads(text), "\n".join(console)


@pytest.fixture(scope="module")
def plan_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert main(["plan", "memory", "--model", "lesson-70b-style", "--gpus", "16", "--gpu-memory", "80GB",
                 "--report", str(out), "--quiet"]) == 0
    return (out / "report.html").read_text()


def test_the_plan_report_loads_with_every_table_and_image(plan_report, tmp_path):
    seen, console = _probe(plan_report, tmp_path)
    assert seen["violations"] == [] and seen["errors"] == [] and console == ""
    assert [t["caption"] for t in seen["tables"]] == ["The lesson's order of questions",
                                                      "Every valid layout, ranked by lesson"]
    assert [t["rows"] for t in seen["tables"]] == [5, 124]
    assert len(seen["images"]) == 2
    for img in seen["images"]:
        assert img["complete"] and img["width"] > 300 and img["height"] > 200
        assert [str(img["width"]), str(img["height"])] == img["stated"]  # decoded to the PNG header's size


def test_the_check_report_loads(tmp_path):
    assert main(["check", "--only", "golden", "--report", str(tmp_path / "c"), "--quiet"]) == 0
    seen, console = _probe((tmp_path / "c" / "report.html").read_text(), tmp_path)
    assert seen["violations"] == [] and seen["errors"] == [] and console == ""
    assert [t["caption"] for t in seen["tables"]] == ["Results"] and seen["tables"][0]["rows"] > 100


def test_the_probe_sees_a_blocked_request_and_a_broken_image(plan_report, tmp_path):
    bad = '<img src="http://example.invalid/x.png" alt="remote"><img src="data:image/png;base64,AAAA" alt="broken">'
    seen, console = _probe(plan_report, tmp_path, extra_body=bad)
    assert any(v.startswith("img-src http://example.invalid/x.png") for v in seen["violations"])
    assert [i["width"] for i in seen["images"]][-2:] == [0, 0]
    assert len(seen["errors"]) == 2 and "Content Security Policy" in console
