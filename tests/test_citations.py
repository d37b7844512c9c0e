"""Sources are cited by their public titles: the lesson "Scaling and distributed training"
(adapted in part from *AI Engineering from Scratch*), "Chapter 26: Distributed Training" of
*Language Modelling: The Complete Guide*, and papers by authors, year, title and section.
Never by an internal document number, nor by a file the repository does not hold."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ["distcheck", "docs", "golden", "tests", "properties", "benchmarks", ".ci", "README.md", "pyproject.toml"]
# written in pieces, so that this file does not match itself
FORBIDDEN = re.compile("|".join(re.escape(a + b) for a, b in [("seed", " 00"), ("seed", "_00"), ("REFERENCES", ".md")]),
                       re.IGNORECASE)


def _text_files():
    for name in SCANNED:
        path = ROOT / name
        for p in [path] if path.is_file() else sorted(path.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in {"", ".py", ".md", ".toml", ".txt", ".sh"}:
                yield p


def test_the_scan_covers_the_package_docs_and_golden_keys():
    scanned = {p.relative_to(ROOT).as_posix() for p in _text_files()}
    assert {"README.md", "docs/AUDIT.md", "golden/lesson.toml", "golden/chapter.toml", "distcheck/parallel/dp/forms.py",
            "distcheck/audit/quantities.py", ".ci/run"} <= scanned


def test_no_citation_by_document_number_or_missing_file():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
            for p in _text_files() for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert not hits, "\n".join(hits)


def test_the_golden_keys_name_their_documents_by_title():
    from distcheck.audit import load_key

    assert load_key(ROOT / "golden" / "lesson.toml").source.startswith(
        "the lesson 'Scaling and distributed training' (adapted in part from AI Engineering from Scratch")
    assert load_key(ROOT / "golden" / "chapter.toml").source.startswith(
        "'Chapter 26: Distributed Training' of Language Modelling: The Complete Guide")
