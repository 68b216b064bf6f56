"""Ray Serve deployment of the Classifier: `app` (deployment + builder), `http` (FastAPI routes), `schemas`
(request/response bodies), `encode` (response bytes), `api_key` (the bearer key every route but /healthz asks for),
`worker` (the replica's device owner: batching, probes, a reload's build step by step), `health` (its health
checks), `reload` (a new configuration on the weights a replica holds), `metrics` (Prometheus), `ingress` (Ray Serve
flags, the proxy's 503 on a lost replica), `playground` (the page at `/`, static/, and its routes: GET /v1/check,
PUT /v1/prompts).

Importing this package does not import Ray; `qcls.deployments.app` does. The tests' replica helpers and fault
injection live in qcls/testing/; `qcls serve` and `qcls reload` in qcls/cli/."""
