"""The config kernel every layer may import: how a key is declared and checked (fields.py), the sections the
plug-ins share (sections.py) and their rules (rules.py), a node built into its typed object (load.py) and the error
types (errors.py). The whole run's schema and `load_config` sit above the plug-ins, in resfl_lightning/run_config/.
Only the error types are exported here, so that any module can raise them without importing more."""

from resfl_lightning.config.errors import ConfigError, InputError

__all__ = ["ConfigError", "InputError"]
