"""`qcls check`: what a configuration will cost and whether it can start, read from the model's config and
tokenizer alone (no weight, no GPU): report.py gathers the facts, text.py prints them for people; served.py
reads the same facts from a running Classifier (the playground's GET /v1/check)."""
