"""Classify a query log: files in, files out (`qcls bulk`; docs/bulk.md).

readers: input formats → rows (bad rows become error rows, a file that is not what its name says is refused
at start); outputs: result columns, part files and the final file (the bounded query → result map is
qcls/results/cache.py, shared with `Classifier`);
pipeline: distinct queries through a Classifier with two batches in flight; runner: the single-process run
(chunks, dedupe, resume); ray_runner: the same through Ray Data; progress: the progress line and summary;
pool: the queries `qcls label-next` chooses from (a query file or a prediction-log folder).
"""
