"""Hydra search-path plugin: the user's config folders (QCLS_CONFIG_DIR, which `qcls --config-dir DIR` sets) go
in front of everything else, so their group options override the shipped `qcls/conf/` ones of the same name
and sit beside the others. A plugin, not an override: Hydra's own `hydra.searchpath` and `--config-dir` append
after the primary folder (the shipped options would win), and a plugin serves composition and the `hydra.main`
apps (`qcls sweep`, `qcls calibrate`, and the jobs a launcher starts) alike. Self-contained (no qcls import):
Hydra imports every plugin module whenever it scans for plugins."""
import os

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class QclsConfigDirs(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        dirs = [os.path.abspath(os.path.expanduser(p)) for p in os.environ.get("QCLS_CONFIG_DIR", "").split(os.pathsep) if p]
        for d in reversed(dirs):  # prepending in reverse keeps the first folder first
            search_path.prepend(provider="qcls-user", path=f"file://{d}")
