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

from collections.abc import Callable
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


def _unreadable(value: Any) -> str | None:
    """Why the kit does not read ``value`` (nested more than MAX_DEPTH deep, or a string that is not
    Unicode: JSON's ``\\ud800`` escape can spell a lone surrogate); None when it reads it. No recursion."""
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


def read_lines(path: Path) -> list[Line]:
    """Every non-blank line of ``path`` parsed as a JSON object, in order.

    Raises TraceFormatError: the file cannot be read or holds no line (line None), or a
    line is not UTF-8, not strict JSON, nested too deeply, holds a string that is not
    Unicode, or is not an object (its number).
    Unknown fields are kept; formats ignore them.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(None, f"cannot read the file: {exc.strerror or exc}") from None
    lines = []
    for number, chunk in enumerate(raw.split(b"\n"), start=1):
        try:
            text = chunk.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(number, f"not UTF-8: {exc.reason} at byte {exc.start}") from None
        if not text.strip():
            continue
        try:
            data = jsonio.loads(text)
        except ValueError as exc:
            raise TraceFormatError(number, str(exc)) from None
        if not isinstance(data, dict):
            raise TraceFormatError(number, f"expected a JSON object, got {type(data).__name__}")
        problem = _unreadable(data)
        if problem is not None:
            raise TraceFormatError(number, problem)
        lines.append(Line(number, text, data))
    if not lines:
        raise TraceFormatError(None, "the file holds no trace lines")
    return lines
