"""``--shard i/n``: the part of a long matrix one CI job or machine runs.

Shard i of n (1-based) takes the items at positions i-1, i-1+n, i-1+2n, ... of the list in
the order the script would run it, so the n shards together run every item exactly once, and
neighbouring items (say, consecutive releases) land on different machines.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def parse(text: str) -> tuple[int, int]:
    """``"i/n"`` as (i, n) with 1 <= i <= n; ValueError (one line) otherwise."""
    left, sep, right = text.partition("/")
    try:
        i, n = int(left), int(right)
    except ValueError:
        i = n = 0
    if not sep or n < 1 or not 1 <= i <= n:
        raise ValueError(f"--shard must be i/n with 1 <= i <= n, not {text!r}")
    return i, n


def argument(text: str) -> tuple[int, int]:
    """:func:`parse` for argparse (``type=shard.argument``): a bad value is a usage error, exit 2."""
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def take(items: Sequence[T], shard: tuple[int, int] | None) -> list[T]:
    """The items shard (i, n) runs; all of them when ``shard`` is None."""
    if shard is None:
        return list(items)
    i, n = shard
    return list(items[i - 1 :: n])


HELP = "run only shard i of n (1-based): every n-th item from the i-th, so n jobs together run each item once"
