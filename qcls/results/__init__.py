"""What a classification returns and how it is made: `types` (the result dataclasses `Classifier.classify`
returns, re-exported here), `building` (results from a batch's scores, with their timings and meta), `cache` (the
bounded key → result map of repeated queries) and `answer_fingerprint` (the short name of the configuration that
answered)."""
from qcls.results.types import STAGES, LabelScore, PromptResult, QueryResult

__all__ = ["STAGES", "LabelScore", "PromptResult", "QueryResult"]
