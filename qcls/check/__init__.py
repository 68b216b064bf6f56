"""`qcls check`: what a configuration will cost and whether it can start, read from the model's config and
tokenizer alone (no weight, no GPU): report.py gathers the facts, text.py prints them for people; served.py
reads the same facts from a running Classifier (the playground's GET /v1/check), and prompt_set.py checks a new
prompt set against it, each problem beside its prompt and field (the playground's PUT /v1/prompts)."""
