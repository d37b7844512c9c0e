"""The figures of "Plan a run" (docs/PLANNING.md): each image it shows is made by a command it documents, and
running that command again draws the same content (the same cells, bars and groups, by gid)."""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from distcheck.cli import main

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
#: the gids distcheck.viz gives its cells (matplotlib's own ids vary between versions and are not compared)
OURS = re.compile(r"^((idle|[FBIW])-r\d+-t\d+|(weights|gradients|optimizer|activations)-\d+|capacity|usable|highlight"
                  r"|(tp|cp|pp|dp|ep)-(g\d+-r\d+|node-boundary-\d+)|(compute|tp|cp|pp|dp|bubble|crosses)-\d+)$")


def _section() -> str:
    return (ROOT / "docs" / "PLANNING.md").read_text()


def _commands() -> dict[str, list[str]]:
    """image path -> the argv of the documented command that writes it."""
    out = {}
    for cmd in re.findall(r"`(distcheck plan [^`]*--figure docs/img/[^`]+)`", _section()):
        argv = shlex.split(cmd)[1:]
        out[argv[argv.index("--figure") + 1]] = argv
    return out


def _our_ids(path: Path) -> list[str]:
    return sorted(el.get("id") for el in ET.parse(path).getroot().iter() if OURS.match(el.get("id") or ""))


def test_every_image_the_section_shows_has_its_command():
    # the page is in docs/, so its images are img/...; the commands write docs/img/... from the root
    shown = ["docs/" + p for p in re.findall(r"!\[[^\]]*\]\((img/[^)]+)\)", _section())]
    assert len(shown) == 4 and set(shown) == set(_commands())
    kinds = {"pipeline": "idle-", "memory": "weights-", "layout": "tp-g", "time": "compute-"}
    for path in shown:
        assert (ROOT / path).is_file(), path
        ids = _our_ids(ROOT / path)
        assert any(i.startswith(kinds[path.split("/")[-1].split("-")[0]]) for i in ids), path


@pytest.mark.parametrize("image", sorted(_commands()))
def test_the_documented_command_redraws_the_committed_figure(image, tmp_path, capsys):
    argv = _commands()[image]
    argv[argv.index("--figure") + 1] = str(tmp_path / Path(image).name)
    assert main(argv) == 0
    assert _our_ids(tmp_path / Path(image).name) == _our_ids(ROOT / image)
