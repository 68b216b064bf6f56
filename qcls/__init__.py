"""qcls: classify search queries under N prompts in one forward of a decoder LLM (README.md, docs/design.md)."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("qcls")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
