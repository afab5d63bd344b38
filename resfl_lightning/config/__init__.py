"""The typed config: schema (schema.py, sections.py; fields.py for how a key is declared), cross-key rules
(rules.py) and the one entry, `load_config` (load.py). Only the error types live here, so that any module can raise
them without importing the schema."""

from resfl_lightning.config.errors import ConfigError, InputError

__all__ = ["ConfigError", "InputError"]
