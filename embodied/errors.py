"""User-facing errors: one line that names the field and the fix, never a traceback."""
from __future__ import annotations

import functools
import sys


class UserError(Exception):
    """Bad input from a user (config, dataset, checkpoint, CLI). Message: what is wrong + the fix."""


class DatasetError(UserError):
    pass


class CheckpointError(UserError):
    pass


class ConfigError(UserError):
    pass


def exit_on_user_error(fn):
    """Decorate an entry point: a UserError prints `error: ...` on stderr and exits 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper
