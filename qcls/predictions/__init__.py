"""What qcls answered, written down: the one column schema of `qcls bulk`'s output and the serving prediction
log (schema.py). Prediction columns are named so that no labelled-file reader takes them for gold labels."""
