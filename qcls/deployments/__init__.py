"""Ray Serve deployment of the Classifier: `app` (deployment + builder), `http` (FastAPI routes), `schemas`
(request/response bodies), `encode` (response bytes), `api_key` (the bearer key every route but /healthz asks for),
`worker` (the replica's device owner: `step()` chooses each batch, probe and build step; `reload()` builds a new
configuration on the weights it holds, swaps it in, gives the old one's memory back), `health` (its probes), `reload`
(reload requests and their outcome), `metrics` (Prometheus),
`ingress` (Ray Serve flags, the proxy's 503 on a lost replica), `playground` (the page at `/`, static/, and its
routes: GET /v1/check, PUT /v1/prompts).

Importing this package does not import Ray; `qcls.deployments.app` does. Elsewhere: what a reload may change and where
the API key comes from in qcls/config/ (reloads.py, api_key.py); a prompt set's check against the served Classifier
in qcls/check/prompt_set.py; the tests' replica helpers and fault injection in qcls/testing/; `qcls serve` (and the
handle and replica addresses of a running app) and `qcls reload` in qcls/cli/."""
