"""The one error type for bad configuration."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value, reported as "<dotted.key>: <what is wrong>" before anything is built."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key if key is not None else message.split(":", 1)[0]
