"""Reading a JSONL trace: one JSON object a line, every problem tied to its line number.

A trace checker must never crash on its input: a line that is not UTF-8, not strict
JSON (no NaN or Infinity, kvspec.jsonio), nested too deeply, not an object, or lacks a
field the format needs or holds a value of the wrong type (values.py) is a
TraceFormatError carrying the 1-based line number, which the command turns into exit
code 2. Lines are split on ``\n`` only: U+2028 and the other separators that
``str.splitlines`` also splits on are valid inside a JSON string, and the ``\r`` of a
CRLF file is whitespace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kvspec import jsonio

from . import values

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a trace line may have (the formats need 5): deeper
lines are rejected as they are read, not by a RecursionError somewhere in a check or a report."""

T = TypeVar("T")


class TraceFormatError(Exception):
    """The trace could not be read: ``line`` is the 1-based line at fault, None for the file as a whole."""

    def __init__(self, line: int | None, message: str) -> None:
        self.line, self.message = line, message
        super().__init__(f"line {line}: {message}" if line is not None else message)


@dataclass(frozen=True)
class Line:
    """One non-blank line of a trace: its 1-based number, its text, and the object it holds."""

    number: int
    text: str
    data: dict[str, Any]

    def typed(self, read: Callable[..., T], name: str, value: object, **limits: Any) -> T:
        """``read(name, value, **limits)`` (a reader of values.py); its ValueError is a format error on this line."""
        try:
            return read(name, value, **limits)
        except ValueError as exc:
            raise TraceFormatError(self.number, str(exc)) from None

    def need(self, name: str) -> Any:
        """The field ``name``; a missing field is a format error on this line."""
        if name not in self.data:
            raise TraceFormatError(self.number, f"missing field {name!r}")
        return self.data[name]

    def opt(self, read: Callable[..., T], name: str, **limits: Any) -> T | None:
        """The field ``name`` read with ``read``; None when it is absent or null."""
        value = self.data.get(name)
        return None if value is None else self.typed(read, name, value, **limits)

    def need_int(self, name: str, *, minimum: int | None = None) -> int:
        return self.as_int(name, self.need(name), minimum=minimum)

    def opt_int(self, name: str, *, minimum: int | None = None) -> int | None:
        return self.opt(values.integer, name, minimum=minimum)

    def opt_float(self, name: str) -> float | None:
        return self.opt(values.number, name)

    def need_list(self, name: str) -> list[Any]:
        return self.typed(values.array, name, self.need(name))

    def as_int(self, name: str, value: object, *, minimum: int | None = None) -> int:
        """``value`` as an int (JSON true/false are not ints here); below ``minimum`` is a format error."""
        return self.typed(values.integer, name, value, minimum=minimum)


def _unreadable(value: Any, strings: bool = True) -> str | None:
    """Why the kit does not read ``value`` (nested more than MAX_DEPTH deep, or a string that is not
    Unicode: JSON's ``\\ud800`` escape can spell a lone surrogate); None when it reads it. No recursion.
    ``strings=False``: the text held no escape, so no string need be looked at, only the nesting."""
    if not strings:
        return _too_deep(value)
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "not JSON the kit reads: a string holds a lone surrogate (not Unicode)"
            continue
        inner = [*item.keys(), *item.values()] if isinstance(item, dict) else item if isinstance(item, list) else None
        if inner is None:
            continue
        if depth > MAX_DEPTH:
            return f"not JSON the kit reads: nested more than {MAX_DEPTH} deep"
        stack.extend((child, depth + 1) for child in inner)
    return None


_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def nesting(chunk: bytes) -> int | None:
    """A bound, at C speed, on how deep the arrays and objects of one line of JSON nest (at least the
    depth, at most twice it); None when it cannot tell.

    Without a backslash in the line, every string runs from one quote to the next, so the text
    outside strings is every other piece between quotes; of it, the brackets are kept and the
    innermost pairs removed, ``[]`` then ``{}``, each removal counted. One removal never takes off
    two levels, so the count is at least the depth. A line with a backslash is left to the walk.
    """
    if b"\\" in chunk:
        return None
    brackets = b"".join(chunk.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    depth = 0
    while brackets:
        arrays = brackets.replace(b"[]", b"")
        objects = arrays.replace(b"{}", b"")
        if len(objects) == len(brackets):
            return None  # not balanced: let the walk say what it is
        depth += (len(arrays) < len(brackets)) + (len(objects) < len(arrays))
        brackets = objects
    return depth


def _too_deep(value: Any) -> str | None:
    """:func:`_unreadable`'s depth check alone: only containers are walked."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        inner = item.values() if type(item) is dict else item
        if depth > MAX_DEPTH:
            return f"not JSON the kit reads: nested more than {MAX_DEPTH} deep"
        stack.extend((child, depth + 1) for child in inner if type(child) is dict or type(child) is list)
    return None


def raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Each non-blank line of ``path`` as bytes with its 1-based number, read as it is needed.

    Raises TraceFormatError (line None) when the file cannot be read.
    """
    try:
        jsonio.require_regular(path)
        with path.open("rb") as stream:
            for number, chunk in enumerate(stream, start=1):
                chunk = chunk.rstrip(b"\r\n") if chunk.endswith(b"\n") else chunk
                if chunk.strip():
                    yield number, chunk
    except OSError as exc:
        raise TraceFormatError(None, f"cannot read the file: {exc.strerror or exc}") from None


def _fast_decoder() -> Callable[[bytes], Any] | None:
    """msgspec's JSON decoder where it is installed (the ``events`` extra): several times the stdlib's speed."""
    try:
        import msgspec
    except ImportError:
        return None
    return msgspec.json.Decoder().decode


_FAST = _fast_decoder()


def parse_line(number: int, chunk: bytes) -> Line:
    """One line as a :class:`Line`; TraceFormatError with its number when the kit does not read it.

    msgspec decodes when it is installed; whatever it refuses is read again by kvspec.jsonio, so the
    verdict on a line (and the message for a bad one) is the strict reader's. A line that cannot be
    nested too deeply (fewer openers than MAX_DEPTH) and holds no ``\\u`` escape skips the walk
    of :func:`_unreadable`: it can neither be too deep nor spell a lone surrogate.
    """
    try:
        text = chunk.decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(number, f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    data: Any = None
    if _FAST is not None:
        try:
            data = _FAST(chunk)
        except Exception:  # any refusal: the strict reader says what is wrong
            data = None
    if not isinstance(data, dict):
        try:
            data = jsonio.loads(text)
        except ValueError as exc:
            raise TraceFormatError(number, str(exc)) from None
    if not isinstance(data, dict):
        raise TraceFormatError(number, f"expected a JSON object, got {type(data).__name__}")
    escaped = b"\\u" in chunk
    if escaped or (chunk.count(b"[") + chunk.count(b"{") > MAX_DEPTH and (nesting(chunk) or MAX_DEPTH + 1) > MAX_DEPTH):
        problem = _unreadable(data, strings=escaped)
        if problem is not None:
            raise TraceFormatError(number, problem)
    return Line(number, text, data)


def iter_lines(path: Path) -> Iterator[Line]:
    """Every non-blank line of ``path`` parsed as a JSON object, in order, one at a time (see read_lines)."""
    for number, chunk in raw_lines(path):
        yield parse_line(number, chunk)


def read_lines(path: Path) -> list[Line]:
    """Every non-blank line of ``path`` parsed as a JSON object, in order.

    Raises TraceFormatError: the file cannot be read or holds no line (line None), or a
    line is not UTF-8, not strict JSON, nested too deeply, holds a string that is not
    Unicode, or is not an object (its number).
    Unknown fields are kept; formats ignore them.
    """
    lines = list(iter_lines(path))
    if not lines:
        raise TraceFormatError(None, "the file holds no trace lines")
    return lines
