"""Where failing examples are kept between runs: a folder, or a Redis server shared by processes and machines.

``--example-db`` names one of two things (:func:`parse_example_db`):

- a folder: Hypothesis's ``DirectoryBasedExampleDatabase`` under ``<folder>/<adapter>``;
- a ``redis://[:password@]host[:port][/db]`` (or ``rediss://``, TLS) URL: Hypothesis's
  ``RedisExampleDatabase`` on a client of the ``redis`` package (the ``redis`` extra), its keys
  prefixed ``hypothesis-example:<adapter>:``.

Either way one database per adapter (the state machines of two adapters share a digest), and
it holds Hypothesis's own examples and the kit's kept cases (stateful_tests/case_db.py).
Any host is accepted: the kit never binds a server, and a database shared between machines
is the point of Redis here. What goes to the server is counterexample bytes (Hypothesis's
choice sequences and case JSON: ops and token ids), and nothing read back is ever unpickled
or executed. A URL that does not parse, a missing ``redis`` package, or a server that does
not answer a PING is :class:`ExampleDbError`: one line, exit 2 at the command line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

if TYPE_CHECKING:
    from redis import Redis

REDIS_SCHEMES = ("redis", "rediss")
CONNECT_TIMEOUT_S = 5.0

ExampleDbLocation = Path | str
"""A folder (a Path), or a Redis URL (a str that :func:`parse_example_db` accepted)."""


class ExampleDbError(ValueError):
    """The example database cannot be used; the message is one line."""


def parse_example_db(text: str) -> ExampleDbLocation:
    """``text`` as a location: a ``redis://`` or ``rediss://`` URL (checked, not connected), else a folder."""
    if not text.strip():
        raise ExampleDbError("the example database is empty: give a folder or a redis:// URL")
    if "://" not in text:
        return Path(text)
    parts = urlsplit(text)
    if parts.scheme not in REDIS_SCHEMES:
        raise ExampleDbError(f"{text}: an example database URL is redis:// or rediss://, not {parts.scheme}://")
    try:
        parts.port  # noqa: B018 -- urlsplit checks the port only when it is read
    except ValueError as exc:
        raise ExampleDbError(f"{text}: {exc}") from None
    if not parts.hostname:
        raise ExampleDbError(f"{text}: no host")
    if parts.path not in ("", "/") and not re.fullmatch(r"/\d+", parts.path):
        raise ExampleDbError(f"{text}: the path must be a database number (/0), not {parts.path!r}")
    return text


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def open_example_db(where: ExampleDbLocation | None, name: str) -> ExampleDatabase | None:
    """The example database of adapter ``name`` at ``where`` (None: none kept); a Redis one answered a PING."""
    if where is None:
        return None
    if isinstance(where, Path):
        return DirectoryBasedExampleDatabase(where / _safe(name))
    from hypothesis.extra.redis import RedisExampleDatabase

    return RedisExampleDatabase(_redis_client(where), key_prefix=f"hypothesis-example:{_safe(name)}:".encode())


def _redis_client(url: str) -> Redis:
    """A client of the server at ``url`` that answered a PING."""
    try:
        from redis import Redis
        from redis.exceptions import RedisError
    except ImportError:
        raise ExampleDbError(f"{url}: the Redis example database needs: pip install 'kvspec[redis]'") from None
    try:
        client = Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=CONNECT_TIMEOUT_S)
        client.ping()
    except (RedisError, ValueError, OSError) as exc:
        raise ExampleDbError(f"{url}: cannot use the Redis server: {_one_line(exc)}") from None
    return client


def example_db_problem(where: ExampleDbLocation | None) -> str | None:
    """Why the example database at ``where`` cannot be used (checked before a run starts), or None."""
    if where is None:
        return None
    if isinstance(where, Path):
        return _folder_problem(where)
    try:
        _redis_client(where).close()
    except ExampleDbError as exc:
        return str(exc)
    return None


def _folder_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot hold the example database: something else is there, or it cannot be made or written
    (Hypothesis's folder database would drop every failure silently)."""
    if folder.exists() and not folder.is_dir():
        return f"{folder}: the example database is a folder (or a redis:// URL), and this is a file"
    probe = folder / ".kvspec-probe"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"{folder}: cannot keep the example database here: {exc.strerror or exc}"
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = [
    "REDIS_SCHEMES",
    "ExampleDbError",
    "ExampleDbLocation",
    "example_db_problem",
    "open_example_db",
    "parse_example_db",
]
