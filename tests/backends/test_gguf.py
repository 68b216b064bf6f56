"""A GGUF file as a source (model.source=gguf) under the fp16-offload and bnb backends, with the demo model's
GGUF: dequantized by transformers' GGUF support, then placed (fp16-offload) or re-quantized (bnb)."""
from __future__ import annotations

import logging

import pytest

from qcls.backends.sources import demo_gguf_path
from qcls.classifier import Classifier
from qcls.config.compose import compose
from tests.backends.helpers import scores

pytestmark = pytest.mark.slow  # each GGUF load dequantizes the demo model (~25 s on 2 cores)
QUERIES = ["red summer dress", "boys hoodie", "cheap jeans"]


@pytest.fixture(scope="module")
def gguf() -> list[str]:
    try:
        path = demo_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return ["model.source=gguf", f"model.path={path}"]


def test_gguf_with_fp16_offload_equals_the_converted_demo(demo_classifier, demo_cfg_overrides, gguf):
    clf = Classifier(compose(demo_cfg_overrides + gguf + ["backend=fp16-offload"]))
    assert (scores(clf, QUERIES) - scores(demo_classifier, QUERIES)).abs().max() <= 1e-5
    assert clf.loaded.model.model.embed_tokens.weight.device.type == "cpu"


def test_gguf_requantized_by_bnb_equals_the_integration(demo_cfg_overrides, gguf):
    """transformers refuses a quantization config with a GGUF file; the backend quantizes in place and
    must build what BitsAndBytesConfig builds from the converted checkpoint."""
    pytest.importorskip("bitsandbytes")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    via_gguf = Classifier(compose(demo_cfg_overrides + gguf + ["backend=bnb-nf4"]))
    via_dir = Classifier(compose(demo_cfg_overrides + ["backend=bnb-nf4"]))
    layer = via_gguf.loaded.model.model.layers[0]
    assert type(layer.mlp.down_proj).__name__ == "Linear4bit"
    assert (scores(via_gguf, QUERIES) - scores(via_dir, QUERIES)).abs().max() <= 1e-5


def test_gguf_source_is_refused_by_gptq(gguf):
    from qcls.backends.gptq import GptqBackend
    c = compose(gguf + ["backend=gptq"])
    with pytest.raises(ValueError, match="GGUF source is served by fp16, fp16-offload, bnb-int8 or bnb-nf4"):
        GptqBackend().load(c)
