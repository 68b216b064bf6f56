"""What writing one POST /v1/classify answer costs: the pydantic models (validate the result dicts, then dump)
against orjson straight from the dataclasses (qcls/deployments/encode.py), full and compact, for results
shaped like the benchmark's (N prompts of M labels); and a handle call's result, written and read back with
Serve's default cloudpickle and with the plain pickle qcls's handle asks for. CPU work only: run it on the
serving host.

    python bench/serve_encode.py [--prompts 8] [--labels 10]      # prints; bench/serve_levers.py records it
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qcls.deployments.encode import classify_body  # noqa: E402
from qcls.deployments.schemas import ClassifyResponse, QueryOut  # noqa: E402
from qcls.results import LabelScore, PromptResult, QueryResult  # noqa: E402


def fake_result(prompts: int, labels: int) -> QueryResult:
    ps = [PromptResult(f"prompt{p}", "label0", 0.5, [LabelScore(f"label{i}", -1.25 * i, 0.5 / (i + 1), 2)
                                                         for i in range(labels)]) for p in range(prompts)]
    return QueryResult("red cotton hoodie for boys", ps, None, 6, 1,
                       {"tokenize": 0.1, "prepare": 0.2, "forward": 4.0, "score": 0.1, "postprocess": 0.1,
                        "total": 4.5, "queue_wait": 0.01, "in_replica": 4.6},
                       {"engine": "fast", "strategy": "trie", "tokens_per_forward": 126, "graphs": True, "notes": []})


def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def measure(prompts: int, labels: int) -> dict[str, tuple[float, int]]:
    rs = [fake_result(prompts, labels)]
    pyd = lambda: ClassifyResponse(model="m", results=[QueryOut.of(r) for r in rs]).model_dump_json()  # noqa: E731
    full = lambda: classify_body("m", rs)  # noqa: E731
    compact = lambda: classify_body("m", rs, compact=True)  # noqa: E731
    import pickle

    from ray import cloudpickle
    cp, pk = cloudpickle.dumps(rs), pickle.dumps(rs, pickle.HIGHEST_PROTOCOL)
    handle = [  # a handle call's result: written in the replica, read in the caller
        ("handle: cloudpickle, write + read (Serve's default)", lambda: cloudpickle.loads(cloudpickle.dumps(rs)), cp),
        ("handle: pickle, write + read (qcls's handle)",
         lambda: pickle.loads(pickle.dumps(rs, pickle.HIGHEST_PROTOCOL)), pk)]
    return {**{name: (per_call_us(fn), len(fn())) for name, fn in
               (("pydantic models (before)", pyd), ("orjson, full", full), ("orjson, compact", compact))},
            **{name: (per_call_us(fn), len(data)) for name, fn, data in handle}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--labels", type=int, default=10)
    a = ap.parse_args()
    print(report(measure(a.prompts, a.labels), a.prompts, a.labels))
    return 0


def report(res: dict[str, tuple[float, int]], prompts: int, labels: int) -> str:
    lines = [f"Response encoding, one query, {prompts} prompts × {labels} labels (CPU, per request):", "",
             "| encoder | µs per response | bytes |", "|---|---|---|"]
    lines += [f"| {k} | {us:.1f} | {n} |" for k, (us, n) in res.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
