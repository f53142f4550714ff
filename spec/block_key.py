"""The spec's key of a full block: its parent block's key and its own tokens, chained as engines chain block hashes.

A block is identified by its whole token prefix, yet its key does not hold that prefix:
``BlockKey.chain(parent, tokens)`` refers to the key of the block before it and keeps
only this block's tokens (vLLM hashes its parent's hash with the block's tokens in the
same way). The keys of a prompt of n tokens hold n tokens in all, not n^2 / (2 * block_size).

What every key keeps:

- **Interned**: at most one live key per (parent, tokens), so the keys of equal prefixes
  are one object, equality between keys is identity, and a dict lookup by key costs one
  precomputed hash. The table holds keys weakly: a key lives while a ledger, a memory or
  a child key refers to it, so a long run does not accumulate them.
- **A key equals its prefix**: ``key == tuple(key)`` and ``hash(key) == hash(tuple(key))``,
  so a key is found under its token tuple in any dict or set and a tuple under its key;
  ``len`` is the prefix's length in tokens, ``repr`` its tuple's text. The hash is
  CPython's tuple hash carried from parent to child: O(block_size) per key.
- **Nothing recurses per block**: the prefix, repr, comparison, pickling and release of a
  chain of any depth walk it in a loop.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, NoReturn

Tokens = tuple[int, ...]

_MASK = (1 << 64) - 1
_PRIME_1 = 11400714785074694791
_PRIME_2 = 14029467366897019727
_PRIME_5 = 2870177450012600261
_LENGTH_SALT = _PRIME_5 ^ 3527539


def _fold(acc: int, tokens: Tokens) -> int:
    """CPython's tuple hash state (xxHash lanes, 64-bit) after folding ``tokens`` into ``acc``."""
    for lane in map(hash, tokens):
        acc = (acc + (lane & _MASK) * _PRIME_2) & _MASK
        acc = (((acc << 31) | (acc >> 33)) & _MASK) * _PRIME_1 & _MASK  # rotate left 31, then multiply
    return acc


def _finish(acc: int, length: int) -> int:
    """The tuple hash of ``length`` items from the folded state, as a signed Py_hash_t."""
    acc = (acc + (length ^ _LENGTH_SALT)) & _MASK
    if acc == _MASK:
        return 1546275796
    return acc - (1 << 64) if acc >> 63 else acc


def _tuple_hash_carries() -> bool:
    """Whether this interpreter hashes tuples as ``_fold``/``_finish`` do (CPython >= 3.8, 64-bit)."""
    samples: list[Tokens] = [(), (0,), (1, 2, 3), (2**61, 7, 31_999), tuple(range(40))]
    return sys.hash_info.width == 64 and all(_finish(_fold(_PRIME_5, s), len(s)) == hash(s) for s in samples)


_CARRIED = _tuple_hash_carries()


class BlockKey:
    """The key of one full block: ``parent`` (the key of the block before, None for a prompt's first)
    and this block's ``tokens``. ``depth``: its position in the chain (1 = first block);
    ``length``: tokens in its whole prefix.

    Build keys with :meth:`chain` (or :func:`block_keys`), never directly: interning is what
    makes equal prefixes one object.
    """

    __slots__ = ("__weakref__", "_acc", "_hash", "depth", "length", "parent", "tokens")

    parent: BlockKey | None
    tokens: Tokens
    depth: int
    length: int
    _acc: int
    _hash: int

    _interned: ClassVar[weakref.WeakValueDictionary[tuple[int, Tokens], BlockKey]] = weakref.WeakValueDictionary()

    def __init__(self) -> None:
        raise TypeError("BlockKey.chain(parent, tokens) builds keys; they are interned")

    @classmethod
    def chain(cls, parent: BlockKey | None, tokens: Sequence[int]) -> BlockKey:
        """The key of the block of ``tokens`` that follows ``parent``: the one live key for that pair.

        The table is keyed by the parent's identity: a live entry's child keeps its parent
        alive, so the id names that parent and no other.
        """
        block = tuple(tokens)
        ident = (0 if parent is None else id(parent), block)
        key = cls._interned.get(ident)
        if key is None:
            key = object.__new__(cls)
            acc = _fold(_PRIME_5 if parent is None else parent._acc, block)
            length = len(block) + (0 if parent is None else parent.length)
            fields = {
                "parent": parent,
                "tokens": block,
                "depth": 1 if parent is None else parent.depth + 1,
                "length": length,
                "_acc": acc,
                "_hash": _finish(acc, length) if _CARRIED else 0,
            }
            for name, value in fields.items():
                object.__setattr__(key, name, value)
            if not _CARRIED:  # another interpreter: hash the prefix once (O(length)), never per lookup
                object.__setattr__(key, "_hash", hash(key.prefix()))
            cls._interned[ident] = key
        return key

    @classmethod
    def of_blocks(cls, blocks: Sequence[Sequence[int]]) -> BlockKey | None:
        """The key of the last of ``blocks`` (token runs, the first block first); None for none."""
        key: BlockKey | None = None
        for block in blocks:
            key = cls.chain(key, block)
        return key

    def ancestry(self) -> list[BlockKey]:
        """This key and every key before it, the first block first."""
        keys: list[BlockKey] = []
        key: BlockKey | None = self
        while key is not None:
            keys.append(key)
            key = key.parent
        keys.reverse()
        return keys

    def prefix(self) -> Tokens:
        """The whole token prefix this key stands for (built on demand: O(length))."""
        return tuple(itertools.chain.from_iterable(k.tokens for k in self.ancestry()))

    # -- a key is its prefix: comparison, hashing, length, iteration, text ----------------------
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        """Equal to a key or a tuple of the same prefix. Two keys of one chaining are equal only if
        identical (interned); the prefixes are compared only when hash and length agree."""
        if self is other:
            return True
        if isinstance(other, BlockKey):
            return self._hash == other._hash and self.length == other.length and self.prefix() == other.prefix()
        if isinstance(other, tuple):
            return self.length == len(other) and self.prefix() == other
        return NotImplemented

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        return iter(self.prefix())

    def __repr__(self) -> str:
        return repr(self.prefix())

    # -- immutable, and copied or pickled as the blocks it chains (re-interned on load) ----------
    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("a BlockKey is immutable")

    def __copy__(self) -> BlockKey:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> BlockKey:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return BlockKey.of_blocks, (tuple(k.tokens for k in self.ancestry()),)


Prefix = BlockKey | Tokens
"""Token content as the spec keys it: a block's chained key, or a token tuple (the prefix such a key
equals, as a hand-made memory may write it; a record's or entry's prompt)."""


def block_keys(
    tokens: Sequence[int], block_size: int, *, start: int = 0, parent: BlockKey | None = None
) -> Iterator[BlockKey]:
    """The keys of the full blocks of ``tokens`` from block ``start`` on, each chained on the one before.

    ``parent`` is the key of block ``start - 1`` (None when ``start`` is 0). Lazy: a caller
    that stops at the first uncached block builds no key past it.
    """
    for begin in range(start * block_size, len(tokens) - block_size + 1, block_size):
        parent = BlockKey.chain(parent, tokens[begin : begin + block_size])
        yield parent


def parent_prefix(content: Prefix, block_size: int) -> Prefix | None:
    """The content of the block before: a key's parent, or a token prefix less its last block (None: a first block)."""
    if isinstance(content, BlockKey):
        return content.parent
    return content[:-block_size] if len(content) > block_size else None
