"""Objects named by a 'package.module:Name' path: how the kit finds what a user names (an adapter, an encoding)."""

from __future__ import annotations

import importlib
import os
import sys


class DottedPathError(Exception):
    """The path names no importable object; the message says why, in one line."""


def import_object(path: str, form: str = "package.module:Name") -> object:
    """The object ``path`` names: ``package.module`` imported, its attribute ``Name`` read.

    ``form`` is how the error message spells the expected shape of ``path``. A module that is not importable
    from ``sys.path`` is looked for in the working directory too (as ``python -m`` would find it), after
    everything installed.
    """
    module_name, _, attr = path.partition(":")
    if not attr:
        raise DottedPathError(f"{path!r} is not of the form {form!r}")
    try:
        module = _import_module(module_name)
    except ImportError as exc:
        raise DottedPathError(f"cannot import {module_name!r}: {exc}") from exc
    except (Exception, SystemExit) as exc:  # user code: a SyntaxError, or anything its import runs
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise DottedPathError(f"importing {module_name!r} raised {type(exc).__name__}{where}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise DottedPathError(f"{module_name!r} has no attribute {attr!r}") from exc


def _import_module(name: str) -> object:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        if exc.name != name.partition(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(name)
