"""qcls.results: the dataclasses survive pickling (Serve handle calls carry them) field for field."""
from __future__ import annotations

import copy
import pickle

from ray import cloudpickle

from qcls.results import LabelScore, PromptResult, QueryResult


def sample() -> list[QueryResult]:
    cal = PromptResult("category", "dress", 0.64, [LabelScore("dress", -0.4, 0.64, 2, 0.61, -0.3),
                                                    LabelScore("jeans", -1.2, 0.36, 1, 0.39, -1.5)],
                       raw_label="dress", raw_prob=0.61)
    raw = PromptResult("audience", "none", 0.9, [LabelScore("none", -0.1, 0.9, 1), LabelScore("man", -2.3, 0.1, 1)])
    ok = QueryResult("maxi dress", [cal, raw], None, 3, 2, {"total": 4.5, "queue_wait": 0.1}, {"engine": "fast"})
    return [ok, QueryResult("", error="empty query")]


def test_pickle_and_cloudpickle_round_trip_every_field():
    rs = sample()
    for back in (pickle.loads(pickle.dumps(rs, pickle.HIGHEST_PROTOCOL)), cloudpickle.loads(cloudpickle.dumps(rs)),
                 copy.deepcopy(rs)):
        assert back == rs and back[0].to_dict() == rs[0].to_dict()
        assert back[0].prompts[0].labels[0].raw_prob == 0.61 and back[0].prompts[0].raw_label == "dress"
        assert back[0].prompts[0].labels[0].head_score == -0.3
        assert not back[1].ok and back[1].error == "empty query" and back[1].prompts == []
