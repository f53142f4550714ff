"""Strict readers of the values in a trace or an ops file: the type a field must have, or a ValueError naming it.

JSON has one number type, and Python's json reads ``1``, ``1.0`` and ``true`` as an int, a
float and a bool (a bool is an int to Python). A field that counts (a token, a block id, a
pool size) must be an integer here, never a float or a boolean; a field that measures (a
time, a score) must be a finite number; a flag must be ``true`` or ``false``. Nothing is
converted: a token ``"5"`` or ``5.0`` is an error, not the token 5, so a malformed file is
never judged as if it said something else. Each reader returns the value with its type, or
raises ValueError with one line that names the field; the formats add the line number.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import fields
from typing import Any, TypeVar

from kvspec.spec import Config, Op
from kvspec.spec.ops import MAX_CAPACITY, OP_KINDS

T = TypeVar("T")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


INT64 = 2**63
"""Every integer field of a log (ids, counts, sequence numbers) is a 64-bit one in any engine that writes it;
beyond that it is a malformed line, not a pool of 10^40 blocks (block hashes are read by :func:`block_hash`)."""


def integer(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int: not a float (even ``2.0``) and not a boolean, within the bounds given (and 64 bits)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field {name!r} must be an integer, not {_shown(value)}")
    if not -INT64 <= value < INT64:
        raise ValueError(f"field {name!r} must be a 64-bit integer, not one of {len(str(abs(value)))} digits")
    if minimum is not None and value < minimum:
        raise ValueError(f"field {name!r} must be >= {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"field {name!r} must be <= {maximum}, not {_shown(value)}")
    return value


def number(name: str, value: object) -> float:
    """``value`` (an int or a float, not a boolean) as a finite float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"field {name!r} must be a number, not {_shown(value)}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise ValueError(f"field {name!r} must be a finite number, not {_shown(value)}")
    return result


def string(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string, not {_shown(value)}")
    return value


def boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"field {name!r} must be true or false, not {_shown(value)}")
    return value


def array(name: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"field {name!r} must be a list, not {_shown(value)}")
    return value


def mapping(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"field {name!r} must be an object, not {_shown(value)}")
    return value


def choice(name: str, value: object, allowed: Collection[T]) -> T:
    """``value`` when it is one of ``allowed`` (compared with its type: ``true`` is not ``1``)."""
    for option in allowed:
        if type(value) is type(option) and value == option:
            return option
    raise ValueError(f"field {name!r} must be one of {', '.join(map(str, allowed))}, not {_shown(value)}")


def block_hash(name: str, value: object) -> str | int:
    """A block hash or cache key as logs write it: a string or an integer."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"field {name!r} must be a string or an integer, not {_shown(value)}")
    return value


def config(name: str, data: object) -> Config:
    """A pool ``{capacity, block_size, bytes_per_token}`` (each a positive integer; missing ones default).

    Unknown keys are ignored. The capacity is not bounded here: it counts bytes at entry
    granularity; a caller that counts blocks bounds it with :func:`blocks`.
    """
    found = mapping(name, data)
    given = {f.name: integer(f"{name}.{f.name}", found[f.name], minimum=1) for f in fields(Config) if f.name in found}
    return Config(**given)


def blocks(name: str, value: object) -> int:
    """A pool size counted in blocks: a positive integer up to MAX_CAPACITY."""
    return integer(name, value, minimum=1, maximum=MAX_CAPACITY)


def op(name: str, data: object) -> Op:
    """One op ``{op, req?, tokens?, keep?, mode?}`` of the case schema, every field of its type."""
    found = mapping(name, data)
    req = found.get("req")
    tokens = array(f"{name}.tokens", found.get("tokens", []))
    return Op(
        op=choice(f"{name}.op", found.get("op"), OP_KINDS),
        req=None if req is None else string(f"{name}.req", req),
        tokens=tuple(integer(f"{name}.tokens[{i}]", t) for i, t in enumerate(tokens)),
        keep=boolean(f"{name}.keep", found.get("keep", True)),
        mode=string(f"{name}.mode", found.get("mode", "recompute")),
    )


__all__ = [
    "array",
    "block_hash",
    "blocks",
    "boolean",
    "choice",
    "config",
    "integer",
    "mapping",
    "number",
    "op",
    "string",
]
