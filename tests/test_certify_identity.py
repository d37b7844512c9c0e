"""The certificate names the code it certified: the source file, its sha256 (or the installed
distribution's RECORD's), the git commit and dirty flag, and the distribution's version."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import strategies as st

from distcheck.certify.certificate import Certificate
from distcheck.certify.engine import certify
from distcheck.certify.identity import CodeIdentity, code_identity, git_state
from distcheck.engine.contracts.contract import Contract, Outcome, PropertySpec
from distcheck.engine.contracts.targets import make_target

SOURCE = "def add(a, b):\n    return a + b\n"


@dataclass(frozen=True)
class _Pair:
    a: int
    b: int


class AddContract(Contract):
    """World-free: ``f(a, b) == a + b``."""

    name = "test-identity-add"
    parallelism = "test"
    summary = "adds"
    needs_world = False
    dtypes = ("float64",)
    min_world_size = 1
    min_world_reason = "a sum computed on one process can be wrong"
    properties = (PropertySpec("sum", "f(a, b) == a + b", "exact"),)

    def resolve(self, obj, ref, options):
        return make_target(obj, ref, "function"), options

    def cases(self, world_size, dtype, options):
        return st.builds(_Pair, st.integers(0, 5), st.integers(0, 5))

    def run_rank(self, ctx, target, case, dtype, options):
        from distcheck.engine.contracts.targets import resolve

        return resolve(target)(case.a, case.b)

    def check(self, case, results, world_size, dtype, options):
        return {"sum": Outcome(results[0] == case.a + case.b)}


@pytest.fixture
def module_in(tmp_path, monkeypatch):
    """Write ``SOURCE`` as ``<name>.py`` in a folder and import it from there; returns (module, path)."""
    def make(folder: Path, name: str):
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.py"
        path.write_text(SOURCE)
        monkeypatch.syspath_prepend(str(folder))
        importlib.invalidate_caches()
        module = importlib.import_module(name)
        monkeypatch.setitem(sys.modules, name, module)  # removed again at teardown
        return module, path

    return make


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org",
                           "-c", "commit.gpgsign=false", *args], capture_output=True, text=True, check=True).stdout


def test_the_certificate_carries_the_source_file_and_its_sha256(tmp_path, module_in):
    module, path = module_in(tmp_path / "plain", "dc_identity_plain")
    cert = certify("dc_identity_plain:add", AddContract(), examples=3)
    assert cert.ok and cert.code is not None
    assert cert.code.source_file == str(path.resolve()) and cert.code.hashed == "module"
    assert cert.code.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    doc = Certificate([cert], command="distcheck certify dc_identity_plain:add")
    code = json.loads(doc.to_json())["certifications"][0]["code"]
    assert code["source_file"] == str(path.resolve()) and code["sha256"] == cert.code.sha256
    assert code["hashed"] == "module" and code["hashed_file"] == str(path.resolve())
    md = doc.to_markdown()
    assert f"Code: source {path.resolve()}, sha256 {cert.code.sha256} (the module file)" in md


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_commit_and_the_dirty_flag_of_a_git_checkout(tmp_path, module_in):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    module, path = module_in(repo, "dc_identity_git")
    _git(repo, "add", path.name)
    _git(repo, "commit", "-q", "-m", "add")
    head = _git(repo, "rev-parse", "HEAD").strip()

    clean = code_identity(module.add, "dc_identity_git:add")
    assert (clean.git_commit, clean.git_dirty) == (head, False)
    assert clean.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()

    path.write_text(SOURCE + "# changed\n")  # an uncommitted change
    dirty = code_identity(module.add, "dc_identity_git:add")
    assert (dirty.git_commit, dirty.git_dirty) == (head, True)
    assert dirty.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() != clean.sha256
    md = Certificate([certify(module.add, AddContract(), examples=2)], command="c").to_markdown()
    assert f"git commit {head} (dirty: uncommitted changes)" in md

    _git(repo, "checkout", "-q", "--", path.name)
    assert git_state(path) == (head, False)
    untracked = repo / "dc_identity_new.py"  # a file the commit does not hold
    untracked.write_text(SOURCE)
    assert git_state(untracked) == (head, True)


def test_no_git_leaves_the_commit_unknown(tmp_path, module_in, monkeypatch):
    module, path = module_in(tmp_path / "nogit", "dc_identity_nogit")
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-bin"))  # git cannot be found
    got = code_identity(module.add, "dc_identity_nogit:add")
    assert got.git_commit is None and got.git_dirty is None
    assert got.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_outside_a_checkout_there_is_no_commit(tmp_path, module_in):
    if shutil.which("git") is not None:
        probe = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True)
        if probe.returncode == 0:
            pytest.skip("the temporary folder sits in a git checkout")
    module, _ = module_in(tmp_path / "outside", "dc_identity_outside")
    assert code_identity(module.add, "dc_identity_outside:add").git_commit is None


def test_an_installed_distribution_is_identified_by_its_record():
    from hypothesis import given

    got = code_identity(given, "hypothesis:given")
    dist = importlib.metadata.distribution("hypothesis")
    record = next(f for f in dist.files if f.name == "RECORD")
    assert got.hashed == "RECORD" and got.hashed_file == str(Path(str(record.locate())))
    assert got.sha256 == hashlib.sha256(Path(str(record.locate())).read_bytes()).hexdigest()
    assert got.source_file is not None and got.source_file.endswith("core.py")  # where given is defined
    assert got.git_commit is None  # a wheel's files say nothing of a checkout around the environment
    cert = certify(given, AddContract(), examples=1)
    assert (cert.distribution, cert.version) == ("hypothesis", importlib.metadata.version("hypothesis"))


def test_an_object_with_no_module_file_has_an_empty_identity():
    assert code_identity({"a": 1}) == CodeIdentity()
    assert code_identity(len, "builtins:len") == CodeIdentity()  # a built-in: no file to hash
    assert CodeIdentity().describe().startswith("source: unknown")
