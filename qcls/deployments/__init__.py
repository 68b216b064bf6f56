"""Ray Serve deployment of the Classifier: `app` (deployment + builder), `http` (FastAPI routes),
`schemas` (request/response bodies), `worker` (engine thread, batching, health), `serve_cli` (`qcls serve`).

Importing this package does not import Ray; `qcls.deployments.app` does."""
