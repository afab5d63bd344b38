"""Bad user input (resfl_lightning/config/errors.py: InputError, the config and data-file errors) reported as one line
on stderr naming the key, file, line or column, and exit status 2, without a traceback. HYDRA_FULL_ERROR=1 (the
variable Hydra reads for the same purpose) lets the exception through with its traceback. A bad override (an
unknown key or option) is a config error too, where a command composes the config itself."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from resfl_lightning.config.errors import ConfigError, InputError

FULL_ERROR = "HYDRA_FULL_ERROR"
EXIT_STATUS = 2


def one_line(err: InputError) -> str:
    """'<kind> error: <message>' with the message's line breaks and runs of spaces folded into single spaces."""
    return f"{err.kind} error: {' '.join(str(err).split())}"


@contextlib.contextmanager
def reported_input_errors() -> Iterator[None]:
    """An InputError inside: its one line on stderr, then SystemExit(2) (Hydra's app exits with it too)."""
    try:
        yield
    except InputError as err:
        if os.environ.get(FULL_ERROR) == "1":
            raise
        print(one_line(err), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STATUS) from None


@contextlib.contextmanager
def composition_errors() -> Iterator[None]:
    """Hydra's errors while composing the config (an unknown key, a missing option, an override it cannot parse) as
    a ConfigError with Hydra's message (its search-path listing left out)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:
        if os.environ.get(FULL_ERROR) == "1":
            raise
        raise ConfigError(str(err).split("Config search path:")[0].strip(), "overrides") from None
