"""The paged bugs of tests/seeded_bugs.py, expressed on the spec's Z3 encoding: variants of ``Encoding``.

Each overrides one decision point of the spec's allocator with the mistake.
``name`` is the name of the paged bug it models (tests/test_bmc.py replays its
counterexample on that implementation), ``invariant`` the one that must report it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import z3

from kvspec.spec.formal.symbolic import RELEASE, Encoding, NewestEncoding, SymOp, SymState, Term


class BuggyEncoding(Encoding):
    """A variant of the spec's encoding with one seeded mistake."""

    name: ClassVar[str]
    invariant: ClassVar[str]
    description: ClassVar[str]


class ForgetDecrement(BuggyEncoding):
    name = "forget-decrement"
    invariant = "ref_count_matches_references"
    description = "release skips the decrement of a block another request still shares"

    def drops_reference(self, entry: Term, ref: Term) -> Term:
        return z3.And(entry, z3.Not(ref > self.num(1)))


class DoubleDecrement(BuggyEncoding):
    name = "double-decrement"
    invariant = "non_negative_ref_counts"
    description = "release decrements the first block twice"

    def ref_counts_at_free(self, s: SymState, nb: Term, row: Sequence[Term]) -> list[Term]:
        one, zero = self.num(1), self.num(0)
        return [z3.If(z3.And(nb > zero, row[0] == self.num(t)), v - one, v) for t, v in enumerate(s.ref)]


class EvictReferenced(BuggyEncoding):
    name = "evict-referenced"
    invariant = "no_active_eviction"
    description = "a prefix hit on a cached-free block takes a reference but leaves it in the free queue"

    def queue_after_admission(
        self, s: SymState, pos: list[Term], hits: Sequence[Term], queued: Sequence[Term], need: Term
    ) -> list[Term]:
        # The hit blocks that were queued go back to the queue's tail.
        n_ = range(self.bounds.blocks)
        left = self.count(queued) - self.count([z3.And(hits[t], queued[t]) for t in n_]) - need
        return [
            z3.If(
                z3.And(hits[t], queued[t]),
                left + self.count([z3.And(hits[x], queued[x], s.klen[x] < s.klen[t]) for x in n_]),
                pos[t],
            )
            for t in n_
        ]


class LeakOnRefusal(BuggyEncoding):
    name = "leak-on-refusal"
    invariant = "atomic_failure"
    description = "a refused admission keeps the references it took on its prefix"

    def refused_admission(self, s: SymState, hits: Sequence[Term], pos: Sequence[Term]) -> SymState:
        one, zero = self.num(1), self.num(0)
        n_ = range(self.bounds.blocks)
        return SymState(
            ref=tuple(s.ref[t] + z3.If(hits[t], one, zero) for t in n_),
            klen=s.klen,
            kbits=s.kbits,
            hashed=s.hashed,
            lost=s.lost,
            fill=s.fill,
            hits=s.hits,
            pos=tuple(z3.If(hits[t], self.num(-1), pos[t]) for t in n_),
            st=s.st,
            tlen=s.tlen,
            tbits=s.tbits,
            nb=s.nb,
            tab=s.tab,
        )


class FloorRounding(BuggyEncoding):
    name = "floor-rounding"
    invariant = "tail_rounding"
    description = "blocks per request rounded down: the partial tail gets no block"

    def blocks_for(self, n: Term) -> Term:
        floor = self.floor_div(n)
        return z3.If(floor > self.num(1), floor, self.num(1))


class ShareCopies(BuggyEncoding):
    name = "share-copies"
    invariant = "share_without_duplication"
    description = "a cached prefix is copied into fresh blocks"

    def shared_prefix(self, chain: Term) -> Term:
        return self.num(0)


class ReuseKeepsIndex(BuggyEncoding):
    name = "reuse-keeps-index"
    invariant = "cache_index_consistency"
    description = "a cached-free block popped for reuse loses its key but stays in the index"

    def unindex_popped(self, s: SymState, popped: Sequence[Term]) -> tuple[list[Term], list[Term]]:
        return list(s.klen), list(s.kbits)


class LostOnReclaim(BuggyEncoding):
    name = "lost-on-reclaim"
    invariant = "capacity_conservation"
    description = "a reclaimed block is never returned to the free queue"

    def joins_free_queue(self, freed: Term, reclaimed: Term) -> Term:
        return z3.And(freed, z3.Not(reclaimed))


class SilentDoubleRelease(BuggyEncoding):
    name = "silent-double-release"
    invariant = "bad_input_rejected"
    description = "releasing an unknown request is silently accepted"

    def accepts(self, s: SymState, op: SymOp) -> Term:
        return z3.Or(self.valid(s, op), op.kind == self.num(RELEASE))


class HitDropsKey(BuggyEncoding):
    name = "hit-drops-key"
    invariant = "hit_keeps_key"
    description = "a prefix hit on a cached-free block takes it back as a fresh block: its key is dropped"

    def hit_keys(
        self, s: SymState, hits: Sequence[Term], queued: Sequence[Term], keys: tuple[list[Term], list[Term], list[Term]]
    ) -> tuple[list[Term], list[Term], list[Term]]:
        klen, kbits, hashed = keys
        n_ = range(self.bounds.blocks)
        dropped = [z3.And(hits[t], queued[t]) for t in n_]
        return (
            [z3.If(dropped[t], self.num(0), klen[t]) for t in n_],
            [z3.If(dropped[t], self.bits(0), kbits[t]) for t in n_],
            [z3.And(z3.Not(dropped[t]), hashed[t]) for t in n_],
        )


class NewestUnkeysOwner(BuggyEncoding, NewestEncoding):
    name = "newest-unkeys-owner"
    invariant = "no_active_eviction"
    description = "duplicate_keys=newest: the new block takes the index entry by dropping the owner's key"

    def displaced_keys(
        self, keys: tuple[list[Term], list[Term], list[Term], list[Term]], displaced: Sequence[Term]
    ) -> tuple[list[Term], list[Term], list[Term], list[Term]]:
        klen, kbits, hashed, lost = keys
        return (
            [z3.If(d, self.num(0), v) for d, v in zip(displaced, klen, strict=True)],
            [z3.If(d, self.bits(0), v) for d, v in zip(displaced, kbits, strict=True)],
            [z3.And(z3.Not(d), v) for d, v in zip(displaced, hashed, strict=True)],
            lost,
        )


VARIANTS: tuple[type[BuggyEncoding], ...] = (
    ForgetDecrement,
    DoubleDecrement,
    EvictReferenced,
    LeakOnRefusal,
    FloorRounding,
    ShareCopies,
    HitDropsKey,
    ReuseKeepsIndex,
    LostOnReclaim,
    SilentDoubleRelease,
    NewestUnkeysOwner,
)
"""Every seeded variant, in the order of tests/seeded_bugs.py's paged bugs."""
