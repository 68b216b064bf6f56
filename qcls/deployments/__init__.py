"""Ray Serve deployment of the Classifier: `app` (deployment + builder), `http` (FastAPI routes),
`schemas` (request/response bodies), `encode` (response bytes), `worker` (device threads, batching, health),
`metrics` (Prometheus), `ingress` (Ray Serve flags, the proxy's 503 on a lost replica), `serve_cli`
(`qcls serve`), `playground` (the page at `/`, static/, and its routes: GET /v1/check, PUT /v1/prompts).

Importing this package does not import Ray; `qcls.deployments.app` does."""
