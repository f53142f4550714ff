"""vLLM's published block hash, recomputed from a block's tokens and its parent (vLLM's recipe, not the spec's).

vLLM keys a full block by ``H((parent_hash, tuple(block_tokens), extra_keys))`` where H is the
``prefix_caching_hash_algo`` (default sha256: SHA-256 over ``pickle.dumps(obj, HIGHEST_PROTOCOL)``)
and the first block's parent is ``NONE_HASH = H(seed)``, the seed being ``PYTHONHASHSEED`` when the
server has it set, else ``"vllm-none-hash"``. Events publish the low 64 bits of the 32-byte digest
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default) while the chain runs over full digests, so
the published hash of block i is recomputed from the whole token prefix up to it. Pickling is only
ever used to serialise (pickle.dumps); nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Sequence
from typing import Any

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
SUPPORTED_ALGOS = frozenset({"sha256"})
MASK_64 = (1 << 64) - 1
_sha256, _dumps = hashlib.sha256, pickle.dumps
_LOW_64 = struct.Struct(">Q").unpack_from  # (digest, 24) -> (the digest's last 8 bytes as a big-endian int,)


def sha256_pickle(obj: Any) -> bytes:
    """vLLM's ``sha256``: SHA-256 of the highest-protocol pickle of ``obj``."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def external(digest: bytes) -> int:
    """The 64-bit form that KV events publish: the low 64 bits of the big-endian digest."""
    return int.from_bytes(digest, "big") & MASK_64


class BlockHasher:
    """Recomputes published block hashes from token prefixes, memoising the chain of full digests.

    ``published(prefix)`` is the published hash of the block that ends ``prefix`` (a multiple of
    ``block_size`` tokens, no extra keys: plain token prompts without LoRA, multimodal data or salt).
    """

    def __init__(self, block_size: int, *, algo: str = "sha256", none_hash_seed: str = DEFAULT_NONE_HASH_SEED) -> None:
        if algo not in SUPPORTED_ALGOS:
            raise ValueError(f"hash algorithm {algo!r} is not supported (supported: {sorted(SUPPORTED_ALGOS)})")
        self.block_size = block_size
        self.none_hash = sha256_pickle(none_hash_seed)
        self._digests: dict[tuple[int, ...], bytes] = {(): self.none_hash}

    def digest(self, prefix: Sequence[int]) -> bytes:
        """The full digest of the block ending ``prefix``; parents are computed (and kept) on the way."""
        key = tuple(prefix)
        if len(key) % self.block_size:
            raise ValueError(f"a prefix of {len(key)} tokens is not a whole number of {self.block_size}-token blocks")
        known = self._digests.get(key)
        if known is not None:
            return known
        start = len(key)
        while key[:start] not in self._digests:
            start -= self.block_size
        digest = self._digests[key[:start]]
        for end in range(start + self.block_size, len(key) + 1, self.block_size):
            digest = sha256_pickle((digest, key[end - self.block_size : end], None))
            self._digests[key[:end]] = digest
        return digest

    def root(self) -> bytes:
        """The chain state of the empty prefix: vLLM's NONE_HASH (the first block's parent digest)."""
        return self.none_hash

    def child(self, parent: bytes, tokens: tuple[int, ...]) -> tuple[int, bytes]:
        """The published hash and full digest of the block of ``tokens`` after the block of digest ``parent``."""
        digest = _sha256(_dumps((parent, tokens, None), pickle.HIGHEST_PROTOCOL)).digest()
        return _LOW_64(digest, 24)[0], digest

    def chain(self, parent: bytes, blocks: Sequence[tuple[int, ...]]) -> list[tuple[int, bytes]]:
        """:meth:`child` of each of ``blocks`` in turn, the first after ``parent``, each next after the one before.

        One call per stored event (a BlockStored's blocks run on from its parent): the loop is one hash per
        block, with no Python call per block. The stream ledger keeps each live block's digest and forgets it
        with the block, so the chain costs one hash per stored block and memory per live block
        (kvspec.spec.stream.HashChain).
        """
        # sha256_pickle and external inlined; the low 64 bits are the digest's last 8 bytes, read in place. The
        # protocol is passed by position: pickle.dumps parses a keyword argument at about the cost of the pickling.
        sha256, dumps, protocol, low_64 = _sha256, _dumps, pickle.HIGHEST_PROTOCOL, _LOW_64
        out = []
        for tokens in blocks:
            parent = sha256(dumps((parent, tokens, None), protocol)).digest()
            out.append((low_64(parent, 24)[0], parent))
        return out

    def published(self, prefix: Sequence[int]) -> int:
        """The 64-bit hash a BlockStored event carries for the block ending ``prefix``."""
        return external(self.digest(prefix))
