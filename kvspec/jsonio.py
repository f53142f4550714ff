"""Strict JSON in and atomic JSON out: the one way the kit reads and writes its files.

Reading: only what RFC 8259 calls JSON. ``NaN``, ``Infinity`` and ``-Infinity`` (which
Python's json accepts by default) are rejected, and so is a number too large for a float
(``1e999``, which Python's json reads as infinity); a document nested too deeply for the
parser is a ``ValueError`` like any other malformed input, never a ``RecursionError``.

Writing: the text goes to a temporary file in the target's folder and is renamed over the
target, so a reader never sees half a file and two writers of one path never interleave
(the last rename wins, whole). :func:`ensure_writable` checks a path before a run starts.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a number the kit reads")
    return value


def loads(text: str | bytes) -> Any:
    """The JSON value of ``text``; ValueError (one line) for anything that is not strict JSON."""
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ValueError("not JSON the kit reads: nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc.reason} at byte {exc.start}") from None


def load(path: Path) -> Any:
    """The JSON value in the file at ``path``; OSError when it cannot be read, ValueError when it is not JSON."""
    require_regular(path)
    return loads(path.read_bytes())


def require_regular(path: Path) -> None:
    """OSError unless ``path`` is a regular file (or absent: its open says so): the kit reads files, and a FIFO
    with no writer would block the read forever (a trace is read twice, which no pipe allows)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISDIR(mode):
        raise OSError(errno.EISDIR, "not a regular file but a folder")
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file but a FIFO, a device or a socket")


def finite(value: Any) -> bool:
    """Whether every number in ``value`` is finite (strict JSON can carry no NaN or Infinity)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(finite(v) for v in value)
    return True


def dumps(value: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``value`` (ValueError on NaN or Infinity), newline-terminated."""
    return json.dumps(value, indent=indent, allow_nan=False) + "\n"


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file beside it, then a rename over it."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, then a rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would keep a CI artefact from its other readers
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask: from /proc where Linux shows it, else by setting it and setting it back at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write(path: Path, value: Any, indent: int | None = 2) -> None:
    """Write ``value`` as strict JSON to ``path``, atomically."""
    write_text(path, dumps(value, indent))


def folder_problem(folder: Path) -> str | None:
    """Why files cannot be made in ``folder`` (made when the first is written), or None; nothing is created.

    The nearest part of the path that exists must be a folder this process can write into."""
    here = Path(folder)
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{folder}: cannot make this folder: {here} is a file"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"{folder}: cannot write here: {here} is not writable"
    return None


def ensure_writable(path: Path) -> None:
    """Raise OSError (with the reason) unless a file can be created at ``path``: checked before a run starts."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    os.close(fd)
    os.unlink(tmp)


__all__ = ["dumps", "ensure_writable", "finite", "load", "loads", "write", "write_bytes", "write_text"]
