"""backend=int8 (W8A8): the fast engine equals an eager int8 reference forward (transformers' own forward over the
same Int8Linear modules) on the tiny models, and every refusal names its way out."""
from __future__ import annotations

import pytest
import torch

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.engine.int8_linear import Int8Linear
from qcls.errors import ConfigError, DeviceError
from tests.backends.helpers import PROMPTS, QUERIES, cfg, scores


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama", "gemma3"])
def test_fast_engine_equals_the_eager_int8_reference(tiny_dirs, family):
    c = cfg(tiny_dirs[family], "int8", {"calibration_tokens": 256})
    loaded = get_backend("int8").load(c)
    linears = [m for m in loaded.model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 7 * len(loaded.model.model.layers)  # every decoder linear, none kept in fp
    assert loaded.info and loaded.info[0].startswith(f"int8: {len(linears)} of {len(linears)} decoder linears")
    from qcls.engine.int8_linear import cpu_gemm
    fallback = [n for n in loaded.notes if n.startswith("int8 GEMM on the CPU through torch._int_mm")]
    assert len(fallback) == (cpu_gemm()[0] == "int_mm")  # the slower kernel is said at start-up
    fast = Classifier(c, loaded=loaded)
    ref = Classifier(cfg(tiny_dirs[family], "int8", {"calibration_tokens": 256}, engine={"kind": "reference"}),
                     loaded=loaded)
    got, want = scores(fast), scores(ref)
    # the same int8 arithmetic; the activations differ only by float32 summation order before rounding to int8,
    # which moves a value across a rounding boundary now and then
    assert (got - want).abs().max() < 2e-3, (got - want).abs().max()
    assert torch.equal(got.view(len(QUERIES), -1).argmax(-1), want.view(len(QUERIES), -1).argmax(-1))
    assert fast.engine.dec.qkv[0] is not None and isinstance(fast.engine.dec.qkv[0], Int8Linear)  # one GEMM
    assert fast.notes[0].startswith("int8:")


def test_int8_stays_close_to_floating_point(tiny_dirs):
    c8 = cfg(tiny_dirs["qwen3"], "int8", {"calibration_tokens": 256})
    fp = scores(Classifier(cfg(tiny_dirs["qwen3"])))
    q8 = scores(Classifier(c8))
    assert (q8 - fp).abs().max() < 0.1 * fp.abs().max()


def test_a_group_over_the_error_bound_keeps_its_weights(tiny_dirs):
    loaded = get_backend("int8").load(cfg(tiny_dirs["llama"], "int8", {"max_error": 1e-9, "calibration_tokens": 128}))
    assert not any(isinstance(m, Int8Linear) for m in loaded.model.modules())
    assert "kept in fp16" in loaded.info[0] and "layer 0 q_proj/k_proj/v_proj" in loaded.info[0]
    scores(Classifier(cfg(tiny_dirs["llama"], "int8"), loaded=loaded))  # and it still classifies


@pytest.mark.parametrize("kept", [("gate_proj",), ("down_proj",), ("q_proj",), ("o_proj",)])
def test_a_layer_with_some_groups_kept_in_floating_point_equals_the_reference(tiny_dirs, monkeypatch, kept):
    """Each mix of int8 and floating-point neighbours (gate/up kept with down in int8 and the other way round; the
    same for q/k/v and o) runs in the fast engine as in the eager reference."""
    from qcls.backends import int8_calibration as cal
    quantize = cal._quantize_group

    def keep_some(layer, names, x, alphas, max_error, report, index):
        if names[0] in kept:
            report.kept.append(f"layer {index} {'/'.join(names)} (kept by the test)")
        else:
            quantize(layer, names, x, alphas, max_error, report, index)

    monkeypatch.setattr(cal, "_quantize_group", keep_some)
    # calibrated here, not read from a file that another choice of kept groups wrote
    c = cfg(tiny_dirs["llama"], "int8", {"calibration_tokens": 128, "cache": False})
    loaded = get_backend("int8").load(c)
    n_int8 = sum(isinstance(m, Int8Linear) for m in loaded.model.modules())
    assert 0 < n_int8 < 7 * len(loaded.model.model.layers)
    got = scores(Classifier(c, loaded=loaded))
    want = scores(Classifier(cfg(tiny_dirs["llama"], "int8", engine={"kind": "reference"}), loaded=loaded))
    assert (got - want).abs().max() < 2e-3, (got - want).abs().max()


def test_the_output_error_measured_in_chunks_equals_the_whole_product():
    from qcls.backends.int8_calibration import output_errors
    from qcls.engine.int8_kernels import quantize_rows_torch
    from qcls.engine.int8_linear import int_mm, quantize_weight
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(96, 64, generator=g), torch.randn(200, 64, generator=g)
    x[:, 3] *= 30  # an outlier channel, which smoothing moves into the weights
    smooths = [None, (w.abs().amax(0) ** 0.5 / x.abs().amax(0) ** 0.5)]
    whole = []
    for m in smooths:  # the definition, on the whole product at once
        (qx, sx), (qw, sw) = quantize_rows_torch(x, m), quantize_weight(w, m)
        y, ref = int_mm(qx, qw).float() * sx[:, None] * sw[None, :], x @ w.t()
        whole.append(float((y - ref).norm() / ref.norm()))
    for chunk in (7, 64, 1000):  # a last chunk shorter than the others, and one chunk
        assert output_errors(x, w, smooths, chunk) == pytest.approx(whole, rel=1e-5)
    assert whole[1] < whole[0]


def test_calibration_queries_from_a_file(tiny_dirs, tmp_path):
    f = tmp_path / "q.csv"
    f.write_text("query,category\nred dress,dress\nblue jeans,jeans\n")
    loaded = get_backend("int8").load(cfg(tiny_dirs["qwen3"], "int8", {"calibration_queries": str(f),
                                                                       "calibration_tokens": 128}))
    assert "calibrated on 128 tokens" in loaded.info[0] and f"the queries of {f}" in loaded.info[0]


@pytest.mark.parametrize("options, match", [
    ({"calibration_queries": "/nonexistent/q.csv"}, "does not exist"),
    ({"alphas": [2.0]}, "alphas must be values in"),
    ({"max_error": 0}, "max_error must be > 0"),
    ({"calibration_tokens": 3}, "at least 64"),
    ({"bits": 4}, "unknown option"),
])
def test_bad_options_are_refused_with_the_way_out(tiny_dirs, options, match):
    with pytest.raises(ConfigError, match=match):
        get_backend("int8").load(cfg(tiny_dirs["qwen3"], "int8", options))


@pytest.mark.parametrize("name, data, match", [
    ("q.csv", b"text\nred dress\n", r"no column 'query' in the header"),
    ("q.xlsx", b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00\xb5U", r"unknown extension '\.xlsx'"),
    ("q.yaml", b"queries:\n  - red dress\n", r"unknown extension '\.yaml'"),
    ("q.csv", b"query\x00\x01\x02\n", "NUL bytes"),
    ("q.txt", b"red dress\nbad \xff byte\n", r"line 2: undecodable bytes"),
    ("q.jsonl", b'{"query": "red dress"}\n[1, 2]\n', r"line 2: malformed"),
    ("q.txt", b"\n  \n", "holds no query"),
])
def test_a_query_file_it_cannot_read_is_refused_with_the_file_and_the_formats(tiny_dirs, tmp_path, name, data,
                                                                              match):
    f = tmp_path / name
    f.write_bytes(data)
    with pytest.raises(ConfigError, match=match) as e:
        get_backend("int8").load(cfg(tiny_dirs["qwen3"], "int8", {"calibration_queries": str(f)}))
    assert "calibration_queries" in str(e.value) or "holds no query" in str(e.value)
    assert "backend int8" in e.value.what and e.value.way_out


def test_every_query_format_gives_the_same_queries(tmp_path):
    from qcls.backends.int8_calibration import read_queries
    files = {"q.txt": "red dress\n\nblue jeans\n", "q.csv": "id,query\n1,red dress\n2,blue jeans\n",
             "q.tsv": "query\tid\nred dress\t1\nblue jeans\t2\n",
             "q.jsonl": '{"query": "red dress"}\n{"query": " blue jeans "}\n'}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        assert read_queries(str(tmp_path / name)) == ["red dress", "blue jeans"], name


def test_shapes_and_old_gpus_are_refused_before_weights_are_read(monkeypatch):
    from types import SimpleNamespace

    from qcls.backends import int8
    bad = SimpleNamespace(hidden_size=60, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16)
    with pytest.raises(ConfigError, match="multiples of 8") as e:
        int8.check_shapes(bad)
    assert "backend=fp16" in str(e.value)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 0))
    with pytest.raises(DeviceError, match="sm_70") as e:
        int8.check_device(torch.device("cuda"))
    assert "backend=fp16" in str(e.value)


def test_memory_estimate_knows_int8():
    from transformers import AutoConfig

    from qcls.backends import memory
    from qcls.config.compose import validate
    mc = AutoConfig.for_model("qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                              num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                              tie_word_embeddings=False)
    c = validate({"model": {"name": "q8b", "source": "local", "path": "/x"}, "prompts": PROMPTS,
                  "backend": {"name": "int8"}})
    e8, e16 = memory.estimate(c, mc, "int8"), memory.estimate(c, mc, "fp16")
    assert e8.weights_gpu < 0.6 * e16.weights_gpu
    assert e8.total < 15 * memory.GIB  # Qwen3-8B whole on a 16 GB T4


def test_the_slower_cpu_kernel_is_said_at_start_up(tiny_dirs, monkeypatch):
    from qcls.backends import int8 as backend
    monkeypatch.setattr(backend, "cpu_gemm", lambda: ("int_mm", "oneDNN's int8 linear is not exact on this CPU"))
    loaded = get_backend("int8").load(cfg(tiny_dirs["qwen3"], "int8", {"calibration_tokens": 256}))
    assert loaded.notes[-1] == ("int8 GEMM on the CPU through torch._int_mm, slower than oneDNN's packed kernel: "
                                "oneDNN's int8 linear is not exact on this CPU")
