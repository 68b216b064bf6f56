"""What qcls is configured by and how a configuration is made: `schema` (the validated `QclsConfig` and its parts,
re-exported here), `compose` (Hydra composition → `QclsConfig`), `errors` (a validation error told as the user's
file and line), `paths` (the shipped config and data, the user's config folders), `overrides` (telling Hydra
overrides from other command-line arguments), `autoscaling` (serve.autoscaling against Ray Serve's schema) and
`reloads` (what a reload of a running deployment may change).

Importing this package imports the schema only (pydantic); `qcls.config.compose` brings in Hydra, and Ray only
for a config that sets serve.autoscaling."""
from qcls.config.schema import (MAX_PROMPTS, MODEL_HEAD, STRATEGIES, BackendSpec, EngineSpec, ModelSpec,
                                PredictionLogSpec, PromptSpec, QclsConfig, ScoringSpec, ServeSpec)

__all__ = ["MAX_PROMPTS", "MODEL_HEAD", "STRATEGIES", "BackendSpec", "EngineSpec", "ModelSpec", "PredictionLogSpec",
           "PromptSpec", "QclsConfig", "ScoringSpec", "ServeSpec"]
