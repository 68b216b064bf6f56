"""fp16-offload against fp16 on a GPU (tiny Llama, the GPU test's model): max |Δ score| with the layers resident
(CUDA graphs) and with 1 or 2 of the 2 layers streamed through accelerate (eager). Prints; appends nothing.

    PYTHONPATH=. python bench/offload_diff.py
"""
from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from qcls.classifier import Classifier  # noqa: E402
from qcls.progress import set_quiet  # noqa: E402
from qcls.tiny_models import make_tiny_model_dir, tiny_byte_tokenizer  # noqa: E402
from tests.backends.helpers import cfg, scores  # noqa: E402


def main() -> None:
    set_quiet(True)
    root = tempfile.mkdtemp()
    for fam in ("llama", "qwen3", "gemma3"):
        d = str(make_tiny_model_dir(os.path.join(root, fam), fam, tiny_byte_tokenizer(), seed=1))
        ref = scores(Classifier(cfg(d, "fp16", device="cuda")))
        runs = {"resident": {}, "1 streamed": {"offload_layers": "true", "gpu_layers": 1},
                "2 streamed": {"offload_layers": "true", "gpu_layers": 0}}
        for name, opts in runs.items():
            got = scores(Classifier(cfg(d, "fp16-offload", opts, device="cuda")))
            print(f"{fam} fp16-offload {name}: max |Δ score| vs fp16 = {(got - ref).abs().max().item():.3e}", flush=True)


if __name__ == "__main__":
    main()
