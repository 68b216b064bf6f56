"""qcls's Hydra plugin: the user's config folders in front of the shipped ones (qcls_config_dir.py)."""
