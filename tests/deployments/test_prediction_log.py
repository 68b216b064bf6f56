"""The prediction log on a replica's request path, in-process: QclsDeployment.classify over the EngineWorker and
a made-up Classifier (no Ray started, no model). Each answered query is one row, with its cache hit and the
request's latency; a refused query is not written; the replica's counters hear of the rows."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from qcls.config import PredictionLogSpec
from qcls.deployments.worker import EngineWorker
from qcls.predictions.log import PredictionLog
from qcls.results.cache import ResultCache
from tests.deployments.test_worker import FakeClassifier


class Answering(FakeClassifier):
    """Results that name their configuration, as Classifier's do (the result cache keeps only those)."""

    fingerprint = "fp0"

    def finish(self, batch, wait_is_queue=False):
        out = super().finish(batch, wait_is_queue)
        for r in out:
            r.meta = {"fingerprint": self.fingerprint}
        return out


def test_each_answered_query_of_a_replica_is_one_row(tmp_path):
    from qcls.deployments.app import QclsDeployment

    clf, counts = Answering(), []
    clf.cfg.max_queries_per_request, clf.cache = 16, ResultCache(10)
    replica = QclsDeployment.func_or_class.__mro__[1]  # qcls's class, under Serve's ingress wrapper
    svc = replica.__new__(replica)  # the replica's attributes that classify() reads, without its model
    svc.worker, svc._gather = EngineWorker(clf), False
    svc.metrics = SimpleNamespace(refused_query=lambda why: None, cache_use=lambda *counts: None,
                                  gc=SimpleNamespace(close=lambda: None))
    svc.predictions = PredictionLog(PredictionLogSpec(folder=str(tmp_path / "log")), replica="r",
                                    observer=lambda written, dropped: counts.append((written, dropped)))

    async def requests():
        first = await svc.classify(["dress", " "])
        return first, await svc.classify(["dress"])  # from the result cache
    (answer, refused), (hit,) = asyncio.run(requests())
    svc.__del__()  # what Serve calls once the replica has drained: the queued rows are written
    rows = [json.loads(x) for p in sorted((tmp_path / "log").glob("part-r-*.jsonl"))
            for x in p.read_text(encoding="utf-8").splitlines()]
    assert refused.error and [(r["query"], r["fingerprint"], r["cache_hit"]) for r in rows] == [
        ("dress", "fp0", False), ("dress", "fp0", True)]
    assert [r["latency_ms"] for r in rows] == [answer.timings_ms["in_replica"], hit.timings_ms["in_replica"]]
    assert rows[0]["pred:p"] == "a" and rows[0]["pred:p:prob"] == 1.0 and rows[0]["pred:p:abstained"] is False
    assert tuple(map(sum, zip(*counts))) == (2, 0)
