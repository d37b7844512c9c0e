"""A checkpoint directory written whole or not at all: staging, then a rename, then the pointer swapped.

:func:`save_swap` writes the files of checkpoint ``name`` into ``<root>/<name>.staging``, with a
``MANIFEST.json`` (each file's size and sha256) last, fsyncs each file and the folder, renames the folder
to ``<root>/<name>``, and only then points ``<root>/LATEST`` at it: the pointer is written to a temporary
file beside it, fsynced, and renamed over it with :func:`os.replace` (atomic within one file system on
POSIX). :func:`load_swap` follows the pointer and checks the manifest. A process killed at any point
(SIGKILL) leaves ``LATEST`` naming the previous complete checkpoint, or the new one once the rename is
done: never a half-written one. A staging folder left by a killed save is removed by the next save.
(Power loss is covered as far as the fsyncs of the files, the folder and the root are; a file system that
reorders them beyond POSIX's guarantees is out of scope.)

``hook(written)`` is called after each write of at most ``chunk`` bytes, with the bytes this save has
written so far (the files, the manifest and the pointer): the kill points of the atomicity property.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from distcheck.core.errors import ConfigError

__all__ = ["POINTER", "MANIFEST", "save_swap", "load_swap", "write_chunks"]

#: the file naming the latest complete checkpoint of a root folder
POINTER = "LATEST"
#: the file of a checkpoint folder listing every other file's size and sha256
MANIFEST = "MANIFEST.json"

Hook = Callable[[int], None] | None


def write_chunks(path: Path, data: bytes, written: int, hook: Hook, chunk: int) -> int:
    """Write ``data`` to a new file ``path`` in writes of at most ``chunk`` bytes, calling ``hook`` after each
    with the running total; fsync it. Returns the new total."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(0, max(len(data), 1), chunk):
            part = data[i:i + chunk]
            os.write(fd, part)
            written += len(part)
            if hook is not None:
                hook(written)
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_files(files: Mapping[str, bytes]) -> None:
    for key, data in files.items():
        if not isinstance(key, str) or not key or "/" in key or key in (MANIFEST, ".", "..") or key.startswith("."):
            raise ConfigError("files", key, f"must be a plain file name (no '/', not {MANIFEST}, not hidden)")
        if not isinstance(data, bytes):
            raise ConfigError(f"files[{key!r}]", type(data).__name__, "must be bytes")


def save_swap(root: str | os.PathLike[str], files: Mapping[str, bytes], *, name: str, hook: Hook = None,
              chunk: int = 16) -> Path:
    """Save checkpoint ``name`` (file name -> bytes) under ``root`` and point ``LATEST`` at it (module doc).

    Returns the checkpoint's folder. Raises ConfigError for a bad file name, a ``name`` with a '/', or a
    checkpoint ``name`` that exists already (a checkpoint is never overwritten in place)."""
    _check_files(files)
    if not isinstance(name, str) or not name or "/" in name or name.startswith(".") or name == POINTER:
        raise ConfigError("name", name, "must be a plain folder name")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if final.exists():
        raise ConfigError("name", name, f"exists already in {root} (a checkpoint is never overwritten)")
    for stale in root.glob("*.staging"):
        shutil.rmtree(stale)
    staging = root / f"{name}.staging"
    staging.mkdir()
    written = 0
    manifest = {}
    for key, data in files.items():
        written = write_chunks(staging / key, data, written, hook, chunk)
        manifest[key] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    written = write_chunks(staging / MANIFEST, json.dumps(manifest, sort_keys=True).encode(), written, hook, chunk)
    _fsync_dir(staging)
    os.rename(staging, final)
    _fsync_dir(root)
    tmp = root / f".{POINTER}.tmp"
    write_chunks(tmp, name.encode(), written, hook, chunk)
    os.replace(tmp, root / POINTER)
    _fsync_dir(root)
    return final


def load_swap(root: str | os.PathLike[str]) -> dict[str, bytes]:
    """The files of the checkpoint ``LATEST`` names under ``root``, each checked against the manifest.

    Raises ConfigError when there is no pointer, or the checkpoint it names is incomplete or corrupt."""
    root = Path(root)
    try:
        name = (root / POINTER).read_text()
        folder = root / name
        manifest = json.loads((folder / MANIFEST).read_bytes())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError("checkpoint", str(root), f"has no complete latest checkpoint ({type(e).__name__}: {e})"
                          ) from None
    out = {}
    for key, want in manifest.items():
        try:
            data = (folder / key).read_bytes()
        except OSError as e:
            raise ConfigError("checkpoint", str(folder), f"misses {key} ({e})") from None
        if len(data) != want["bytes"] or hashlib.sha256(data).hexdigest() != want["sha256"]:
            raise ConfigError("checkpoint", str(folder), f"{key} holds {len(data)} B, not the {want['bytes']} B "
                                                          "of its manifest (or another sha256)")
        out[key] = data
    return out
