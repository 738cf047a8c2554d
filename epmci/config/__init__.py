"""Settings: the typed schema (schema.py, the single source of truth), the experiment catalog
(experiments.py), loading epmci.yaml with command-line overrides (load.py) and validation
(validate.py)."""

from .load import find_config, load_config, parse_set, set_path
from .schema import CheckConfig, PerfConfig

__all__ = ["CheckConfig", "PerfConfig", "find_config", "load_config", "parse_set", "set_path"]
