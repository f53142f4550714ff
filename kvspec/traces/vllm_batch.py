"""A vLLM event batch line decoded straight into typed structs: its shape is checked while it is decoded.

msgspec decodes a batch line (``{"seq", "ts", "events": [...]}``, vllm_events.py) into :class:`Batch`,
whose events are a tagged union on ``type`` (vLLM's own ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared``). Every field the stream ledger reads then has the type the strict reader
(vllm_events.validate) requires: ``seq`` an integer, ``ts`` a finite number, hashes integers or
strings, token ids integers, an event's ``block_size`` a positive integer; a JSON ``true`` is no integer.
Fields the ledger does not read (vLLM's ``medium``, ``lora_id``, ``dp_rank`` ...) are skipped.

The decoder keeps this invariant: a line it returns a :class:`Batch` for is one that the strict
reader reads as a batch, with the same values. Every other line -- another record kind (a line
naming ``request``, ``config``, ``metrics``, ``reset`` or ``gap`` is that kind even with ``seq`` and
``events``), a malformed batch, an event type it does not know, a ``\\u`` escape (which can spell a
lone surrogate) -- gives None and is read by the strict path, which says what is wrong with the
line's number. So msgspec only makes the common case fast; the verdict on a line is unchanged.
Without msgspec (the ``events`` extra) :data:`DECODE` is None and every line takes the strict path.
"""

# No ``from __future__ import annotations``: msgspec reads the structs' annotations inside _decoder.
from collections.abc import Callable
from typing import Annotated, Any, ClassVar


def _decoder() -> Callable[[bytes], Any] | None:
    """The typed batch decoder (a function of a line's bytes: a Batch, or None); None without msgspec."""
    try:
        import msgspec
    except ImportError:  # the events extra is not installed
        return None
    unset = msgspec.UNSET
    hash_list = list[int | str]

    # gc=False: the structs hold only ints, strings and lists of them (no reference cycle), so the collector
    # need not track them
    class BlockStored(msgspec.Struct, tag=True, gc=False):
        kind: ClassVar[str] = "BlockStored"
        block_hashes: hash_list
        token_ids: tuple[int, ...]  # a tuple, as the stream ledger keeps a block's tokens (no copy there)
        parent_block_hash: int | str | None = None
        block_size: Annotated[int, msgspec.Meta(ge=1)] | None = None

    class BlockRemoved(msgspec.Struct, tag=True, gc=False):
        kind: ClassVar[str] = "BlockRemoved"
        block_hashes: hash_list

    class AllBlocksCleared(msgspec.Struct, tag=True, gc=False):
        kind: ClassVar[str] = "AllBlocksCleared"

    class Batch(msgspec.Struct, gc=False):
        seq: int
        ts: float
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]
        # Present, any of these makes the line another record kind (vllm_events.kind_of): the strict path's.
        gap: msgspec.Raw | msgspec.UnsetType = unset
        reset: msgspec.Raw | msgspec.UnsetType = unset
        config: msgspec.Raw | msgspec.UnsetType = unset
        request: msgspec.Raw | msgspec.UnsetType = unset
        metrics: msgspec.Raw | msgspec.UnsetType = unset

    decode = msgspec.json.Decoder(Batch).decode
    error = msgspec.DecodeError  # ValidationError is one

    def batch(chunk: bytes) -> Any:
        if b"\\" in chunk and b"\\u" in chunk:  # one byte is found at memchr speed, 7x the two-byte search
            return None
        try:
            found = decode(chunk)
        except (error, RecursionError):  # the strict reader says what is wrong (a nesting too deep, by its line)
            return None
        if (
            found.gap is not unset
            or found.reset is not unset
            or found.config is not unset
            or found.request is not unset
            or found.metrics is not unset
        ):
            return None
        return found

    return batch


DECODE = _decoder()
"""A batch line's bytes -> its Batch (``seq``, ``ts``, ``events``), or None: read the line the strict way."""
