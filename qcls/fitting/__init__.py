"""What is fitted on labelled queries, chosen on a fitting split and reported on another (docs/evaluation.md):
`calibrate` (`qcls calibrate`: the file the `calibration` option loads), `calibration` (per-prompt temperature and
bias), `heads` (learned heads: logistic regression on a hidden state, its strength by cross-validation),
`head_depth` (which layer a head reads, and so how deep the forward runs), `head_fitting` (from a labelled split to a
saved head), `head_options` (their command-line options), `threshold_fitting` (abstention thresholds), `audit`
(`qcls audit`: labels a held-out head finds unlikely), `label_next` (which queries to label next), `baseline`
(the majority class and a TF-IDF regression fitted beside them) and `calibrated_metrics` (metrics before and after
a calibration). Labelled sets and metrics: qcls/eval/ (below); sweeps and their reports: qcls/sweep/ (above)."""
