"""The error types for bad user input: InputError, the base the commands report as one line with exit status 2
(resfl_lightning/cli/input_errors.py), and ConfigError for a config value. The data files' errors derive from
InputError too (resfl_lightning/data/errors.py)."""

from __future__ import annotations


class InputError(Exception):
    """Bad user input (a config value, a data file's content); the message names the key, file, line or column to
    fix. `kind` heads the one-line report ("config error: ...")."""

    kind = "input"


class ConfigError(InputError, ValueError):
    """A bad config value, reported as "<dotted.key>: <what is wrong>" before anything is built."""

    kind = "config"

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key if key is not None else message.split(":", 1)[0]
