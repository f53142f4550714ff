"""Reading a JSONL trace: one JSON object a line, every problem tied to its line number.

A trace checker must never crash on its input: a line that is not JSON, not an
object, or lacks a field the format needs is a TraceFormatError carrying the
1-based line number, which the command turns into exit code 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def need(self, name: str) -> Any:
        """The field ``name``; a missing field is a format error on this line."""
        if name not in self.data:
            raise TraceFormatError(self.number, f"missing field {name!r}")
        return self.data[name]

    def need_int(self, name: str, *, minimum: int | None = None) -> int:
        return self.as_int(name, self.need(name), minimum=minimum)

    def opt_int(self, name: str, *, minimum: int | None = None) -> int | None:
        value = self.data.get(name)
        return None if value is None else self.as_int(name, value, minimum=minimum)

    def opt_float(self, name: str) -> float | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TraceFormatError(self.number, f"field {name!r} must be a number, not {value!r}")
        return float(value)

    def need_list(self, name: str) -> list[Any]:
        value = self.need(name)
        if not isinstance(value, list):
            raise TraceFormatError(self.number, f"field {name!r} must be a list, not {type(value).__name__}")
        return value

    def as_int(self, name: str, value: object, *, minimum: int | None = None) -> int:
        """``value`` as an int (JSON true/false are not ints here); below ``minimum`` is a format error."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceFormatError(self.number, f"field {name!r} must be an integer, not {value!r}")
        if minimum is not None and value < minimum:
            raise TraceFormatError(self.number, f"field {name!r} must be >= {minimum}, not {value}")
        return value


def read_lines(path: Path) -> list[Line]:
    """Every non-blank line of ``path`` parsed as a JSON object, in order.

    Raises TraceFormatError: the file cannot be read (line None), or a line is not
    a JSON object (its number). Unknown fields are kept; formats ignore them.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(None, f"cannot read {path}: {exc}") from exc
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(number, f"not JSON: {exc.msg} at column {exc.colno}") from exc
        except RecursionError as exc:
            raise TraceFormatError(number, "not JSON: nested too deeply") from exc
        if not isinstance(data, dict):
            raise TraceFormatError(number, f"expected a JSON object, got {type(data).__name__}")
        lines.append(Line(number, raw, data))
    if not lines:
        raise TraceFormatError(None, f"{path} holds no trace lines")
    return lines
