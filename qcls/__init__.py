"""qcls: classify search queries under N prompts in one forward of a decoder LLM (README.md, docs/design.md).

    from qcls import Classifier, compose
    clf = Classifier(compose(["model=smollm2_demo"]))

Both are imported on first use, so `import qcls` stays light (the CLI's `--version`, the Hydra plugin)."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("qcls")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Classifier", "compose", "__version__"]
_PUBLIC = {"Classifier": "qcls.classifier", "compose": "qcls.config.compose"}


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'qcls' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(_PUBLIC[name]), name)
