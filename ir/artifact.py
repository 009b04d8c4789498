"""Artifact folders, written atomically: everything goes into a temporary sibling folder, is
fsynced, and is renamed into place, so `folder` is always either the old artifact or the whole
new one, never half of either.

Layout: the caller's files, `weights.safetensors` (the tensors, bf16 included: safetensors
stores BF16 natively and reads it back as ml_dtypes.bfloat16) and `manifest.json`, written last,
carrying the "format" that `read_artifact` checks, the SHA-256 of every other file ("files") and
its own ("sha256", over the manifest without that key): an artifact altered after it was written
(a flipped byte in the weights, an edited max_seq) is refused on load, naming the file.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Callable

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError, safe_open

from .dtypes import DType
from .errors import KilnError

ARTIFACT_FORMAT = 3
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"


def write_artifact(folder: Path, files: dict[str, bytes | str],
                   tensors: dict[str, np.ndarray] | None = None) -> None:
    """Write `files` (name -> content; a "manifest.json" entry, if any, is a JSON object, which
    gets the "format" key) and `tensors` as the artifact at `folder`, replacing a previous one."""
    folder = Path(folder)
    manifest = {**_caller_manifest(files), "format": ARTIFACT_FORMAT}
    _check_target(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    except OSError as err:
        raise KilnError(f"kiln: cannot write {folder}: {_reason(err)}") from err
    try:
        digests = {}
        for name, content in files.items():
            if name != MANIFEST:
                _write(staging / _relative(name), content)
                digests[name] = hashlib.sha256(content.encode() if isinstance(content, str) else content).hexdigest()
        # a non-contiguous array would be written from its raw buffer, in memory order
        safetensors.numpy.save_file({k: np.asarray(v, order="C") for k, v in (tensors or {}).items()},
                                    staging / WEIGHTS)
        _fsync(staging / WEIGHTS)
        digests[WEIGHTS] = _file_digest(staging / WEIGHTS)
        _write(staging / MANIFEST, json.dumps(signed({**manifest, "files": digests}), indent=1))
        for subfolder, _, _ in os.walk(staging):  # their entries, so the files survive a crash
            _fsync(Path(subfolder))
        _move_into_place(staging, folder)
    except (OSError, SafetensorError) as err:
        raise KilnError(f"kiln: cannot write {folder}: {_reason(err)}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the rename succeeded


def check_writable(folder: Path) -> None:
    """Fail before a long compile, not after it, when `folder` cannot be written."""
    folder = Path(folder).absolute()
    existing = folder.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise KilnError(f"kiln: cannot write {folder}: {existing} is a file, not a folder")
    try:      # a probe, not os.access: root passes that check where no file can be made (/proc)
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".kiln-probe-"):
            pass
    except OSError as err:
        raise KilnError(f"kiln: cannot write {folder}: {existing}: {_reason(err)}") from err
    _check_target(folder)


def read_artifact(folder: Path) -> tuple[dict, Callable[[str], bytes], dict[str, np.ndarray]]:
    """(manifest, open_file(name) -> bytes, tensors) of the artifact at `folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise KilnError(f"kiln: {folder} is not a folder; pass the folder `kiln compile` wrote")
    if not (folder / MANIFEST).is_file():
        raise KilnError(f"kiln: {folder} is not a Kiln artifact (it has no {MANIFEST})")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KilnError(f"kiln: the artifact {folder} is corrupted: {MANIFEST}: {err}") from err
    if not isinstance(manifest, dict) or "format" not in manifest:
        raise KilnError(f"kiln: the artifact {folder} is corrupted: {MANIFEST} has no format")
    if manifest["format"] != ARTIFACT_FORMAT:
        raise KilnError(f"kiln: the artifact {folder} has format {manifest['format']!r}, this Kiln "
                        f"reads format {ARTIFACT_FORMAT}; compile the model again")
    _verify(folder, manifest)
    try:
        with safe_open(folder / WEIGHTS, framework="np") as weights:
            tensors = _on_huge_pages(weights, (folder / WEIGHTS).stat().st_size)
    except (OSError, SafetensorError) as err:
        raise KilnError(f"kiln: the artifact {folder} is corrupted: {WEIGHTS}: {err}") from err

    def open_file(name: str) -> bytes:
        try:
            return (folder / _relative(name)).read_bytes()
        except OSError as err:
            raise KilnError(f"kiln: the artifact {folder} is corrupted: cannot read {name}: "
                            f"{_reason(err)}") from err

    return manifest, open_file, tensors


_ALIGN = 64      # each tensor starts on a cache line


def _on_huge_pages(weights, file_bytes: int) -> dict[str, np.ndarray]:
    """The tensors of an open safetensors file, read one at a time into one anonymous mapping
    that the kernel may back with 2 MB pages (Linux's MADV_HUGEPAGE): a decode step streams every
    weight, and on 4 KB pages the CPU backend's step took 3-6% longer (SmolLM2, this project's
    2-core VM). The arrays hold the mapping; nothing is held twice. The file's size bounds the
    tensors' bytes."""
    names = list(weights.keys())
    if any(weights.get_slice(name).get_dtype() == "BF16" for name in names):
        DType.BF16.np       # numpy reads bf16 as ml_dtypes' type, registered when it is imported
    arena = mmap.mmap(-1, file_bytes + _ALIGN * len(names), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        arena.madvise(mmap.MADV_HUGEPAGE)
    tensors, offset = {}, 0
    for name in names:
        tensor = weights.get_tensor(name)
        placed = np.frombuffer(arena, dtype=tensor.dtype, count=tensor.size, offset=offset)
        placed[...] = tensor.reshape(-1)
        tensors[name] = placed.reshape(tensor.shape)
        offset += -(-tensor.nbytes // _ALIGN) * _ALIGN
    return tensors


def signed(manifest: dict) -> dict:
    """The manifest with its own digest ("sha256", over its canonical JSON without that key)."""
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return {**body, "sha256": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


def _verify(folder: Path, manifest: dict) -> None:
    """Refuse an artifact whose manifest or any listed file changed since it was written."""
    def altered(name: str, why: str) -> KilnError:
        return KilnError(f"kiln: the artifact {folder} was altered after it was written: {name} "
                         f"{why}; compile the model again")
    files = manifest.get("files")
    if not isinstance(files, dict) or signed(manifest).get("sha256") != manifest.get("sha256"):
        raise altered(MANIFEST, "does not match its own checksum")
    for name, digest in files.items():
        path = folder / (WEIGHTS if name == WEIGHTS else _relative(name))
        try:
            actual = _file_digest(path)
        except OSError as err:
            raise altered(name, f"cannot be read ({_reason(err)})") from err
        if actual != digest:
            raise altered(name, "does not match the checksum in manifest.json")


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _caller_manifest(files: dict[str, bytes | str]) -> dict:
    content = files.get(MANIFEST, "{}")
    manifest = json.loads(content)
    if not isinstance(manifest, dict):
        raise TypeError(f"{MANIFEST} must be a JSON object, got {type(manifest).__name__}")
    return manifest


def _relative(name: str) -> PurePosixPath:
    # names may come from a manifest read from disk: none may point outside the folder
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or name in ("", ".", WEIGHTS):
        raise KilnError(f"kiln: {name!r} is not a file name an artifact may hold")
    return path


def _check_target(folder: Path) -> None:
    if folder.is_dir() and ((folder / MANIFEST).is_file() or not any(folder.iterdir())):
        return
    if folder.exists() or folder.is_symlink():
        raise KilnError(f"kiln: {folder} exists and is not a Kiln artifact; choose another --out")


def _reason(err: Exception) -> str:
    return getattr(err, "strerror", None) or str(err)


def _write(path: Path, content: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_into_place(staging: Path, folder: Path) -> None:
    """Rename staging to folder; an old artifact there is renamed aside first and deleted after."""
    if not folder.exists():
        staging.rename(folder)
    else:
        # a unique empty folder, which rename(2) may replace: the old artifact's place aside
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
        folder.rename(aside)
        try:
            staging.rename(folder)
        except OSError:
            aside.rename(folder)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    _fsync(folder.parent)
