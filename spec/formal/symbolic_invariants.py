"""The safety invariants of spec.invariants as Z3 formulas over one symbolic transition.

Each function has the name of its Python twin and returns a Z3 Boolean that is
true exactly when the invariant holds on the transition (its ``after`` state
for the state invariants). They read the state through the same projection an
adapter reports: an object is a slot with a reference or a key; free capacity
is the number of queued slots that hold no key (what the reference adapter
reports, and what ``LedgerModel.free`` equals on every state the spec reaches);
the index maps each slot's entry key to the slot, lost duplicates
(``duplicate_keys="newest"``) left out.

``AUXILIARY`` are the strengthening invariants of the induction proofs: facts
about every reachable state of the bounded encoding (the queue holds exactly the
unreferenced slots, densely; keys are unique and match their tokens; ...). They
are not checks an adapter is held to.
"""

from __future__ import annotations

from collections.abc import Callable

import z3

from ..invariants import INVARIANTS, LOST_HIT_INVARIANTS, VIEW_INVARIANTS
from .symbolic import (
    ABSENT,
    ADMIT,
    INVALID,
    OK,
    PREEMPTED,
    RESET,
    RESUME,
    RUNNING,
    Encoding,
    SymState,
    SymTransition,
    Term,
)

TransitionFormula = Callable[[Encoding, SymTransition], Term]
StateFormula = Callable[[Encoding, SymState], Term]


# -- the projection -----------------------------------------------------------------------------


def is_object(s: SymState, t: int) -> Term:
    """Slot ``t`` occupies capacity: it is referenced or carries a key."""
    return z3.Or(s.ref[t] != 0, s.hashed[t])


def free_count(enc: Encoding, s: SymState) -> Term:
    """Queued slots that hold no key."""
    return enc.count([z3.And(s.pos[t] >= enc.num(0), z3.Not(s.hashed[t])) for t in range(enc.bounds.blocks)])


def references(enc: Encoding, s: SymState, t: int) -> Term:
    """Live request-table entries that name slot ``t``."""
    b = enc.bounds
    return enc.count(
        [
            z3.And(s.st[r] != enc.num(ABSENT), enc.num(j) < s.nb[r], s.tab[r][j] == enc.num(t))
            for r in range(b.requests)
            for j in range(b.blocks)
        ]
    )


def same_key(a: SymState, b: SymState, t: int) -> Term:
    """Slot ``t`` carries the same key (or none) in both states."""
    return z3.And(
        a.hashed[t] == b.hashed[t],
        z3.Implies(a.hashed[t], z3.And(a.klen[t] == b.klen[t], a.kbits[t] == b.kbits[t])),
    )


def prefix_bits(enc: Encoding, s: SymState, r: int, blocks: int) -> Term:
    """The first ``blocks`` blocks of request ``r``'s tokens."""
    return s.tbits[r] & enc.mask(blocks * enc.bounds.block_size)


def slot_field(enc: Encoding, values: tuple[Term, ...], slot: Term) -> Term:
    """``values[slot]`` for a symbolic slot number (the last value past the end)."""
    out = values[-1]
    for t in range(len(values) - 2, -1, -1):
        out = z3.If(slot == enc.num(t), values[t], out)
    return out


def indexed_at(enc: Encoding, s: SymState, t: int, blocks: int, bits: Term) -> Term:
    """The index maps the key (``blocks`` blocks of ``bits``) to slot ``t``."""
    return z3.And(s.klen[t] == enc.num(blocks), s.kbits[t] == bits, z3.Not(s.lost[t]))


# -- safety: state invariants ---------------------------------------------------------------------


def capacity_conservation(enc: Encoding, tr: SymTransition) -> Term:
    """free + sum of object sizes == capacity, and free >= 0."""
    s, n = tr.after, enc.bounds.blocks
    free = free_count(enc, s)
    return z3.And(free >= enc.num(0), free + enc.count([is_object(s, t) for t in range(n)]) == enc.num(n))


def non_negative_ref_counts(enc: Encoding, tr: SymTransition) -> Term:
    """No object's ref count is below zero."""
    return z3.And(*[v >= enc.num(0) for v in tr.after.ref])


def ref_count_matches_references(enc: Encoding, tr: SymTransition) -> Term:
    """Each object's ref count equals the number of live request references to it."""
    s, b = tr.after, enc.bounds
    out = []
    for t in range(b.blocks):
        refs = references(enc, s, t)
        out.append(z3.Implies(is_object(s, t), s.ref[t] == refs))
        out.append(z3.Implies(refs > enc.num(0), is_object(s, t)))
    for r in range(b.requests):
        for j in range(b.blocks):
            live = z3.And(s.st[r] != enc.num(ABSENT), enc.num(j) < s.nb[r])
            out.append(z3.Implies(live, z3.And(s.tab[r][j] >= enc.num(0), s.tab[r][j] < enc.num(b.blocks))))
    return z3.And(*out)


def tail_rounding(enc: Encoding, tr: SymTransition) -> Term:
    """An object of n tokens takes ceil(n / block_size) blocks; a request holds exactly that many."""
    s, b = tr.after, enc.bounds
    out = [
        z3.Implies(is_object(s, t), z3.And(s.fill[t] >= enc.num(1), s.fill[t] <= enc.num(b.block_size)))
        for t in range(b.blocks)
    ]
    for r in range(b.requests):
        out.append(z3.Implies(s.st[r] == enc.num(RUNNING), s.nb[r] == enc.ceil_div(s.tlen[r])))
        out.append(z3.Implies(s.st[r] == enc.num(PREEMPTED), s.nb[r] == enc.num(0)))
    return z3.And(*out)


def cache_index_consistency(enc: Encoding, tr: SymTransition) -> Term:
    """Every index entry names an object cached under that key, holding that key's tokens."""
    s, b = tr.after, enc.bounds
    out = [z3.Implies(enc.entry(s, t), z3.And(is_object(s, t), s.hashed[t])) for t in range(b.blocks)]
    out += [_held_keys_match(enc, s, r, j) for r in range(b.requests) for j in range(b.blocks)]
    return z3.And(*out)


def _held_keys_match(enc: Encoding, s: SymState, r: int, j: int) -> Term:
    """If block j of request r carries a key, the block is full and the key is the request's prefix."""
    b = enc.bounds
    slot = s.tab[r][j]
    valid = z3.And(slot >= enc.num(0), slot < enc.num(b.blocks))
    keyed = z3.And(
        s.st[r] != enc.num(ABSENT),
        enc.num(j) < s.nb[r],
        valid,
        slot_field(enc, s.hashed, slot),
    )
    content = z3.And(
        enc.num((j + 1) * b.block_size) <= s.tlen[r],
        slot_field(enc, s.klen, slot) == enc.num(j + 1),
        slot_field(enc, s.kbits, slot) == prefix_bits(enc, s, r, j + 1),
    )
    return z3.Implies(keyed, content)


# -- safety: transition invariants ----------------------------------------------------------------


def share_without_duplication(enc: Encoding, tr: SymTransition) -> Term:
    """A cached prefix is shared by reference, never copied; partial tail blocks are never shared."""
    before, after, op, b = tr.before, tr.after, tr.op, enc.bounds
    n_ = range(b.blocks)
    out = [
        z3.Not(z3.And(references(enc, after, t) > enc.num(1), is_object(after, t), z3.Not(after.hashed[t]))) for t in n_
    ]
    admitted = z3.And(z3.Or(op.kind == enc.num(ADMIT), op.kind == enc.num(RESUME)), tr.step.status == enc.num(OK))
    for r in range(b.requests):
        mine = z3.And(admitted, op.req == enc.num(r))
        out.append(z3.Implies(mine, after.st[r] != enc.num(ABSENT)))
        n = after.tlen[r]
        chain, run = enc.num(0), z3.BoolVal(True)
        cached = []
        for i in n_:
            bits = prefix_bits(enc, after, r, i + 1)
            cached.append([indexed_at(enc, before, t, i + 1, bits) for t in n_])
            run = z3.And(run, enc.num((i + 1) * b.block_size) <= n, z3.Or(*cached[i]))
            chain = chain + z3.If(run, enc.num(1), enc.num(0))
        cap = enc.floor_div(n - enc.num(1))
        chain = z3.If(chain < cap, chain, cap)
        for i in n_:
            shared = z3.And(mine, enc.num(i) < chain, enc.num(i) < after.nb[r])
            reused = z3.Or(*[z3.And(after.tab[r][i] == enc.num(t), cached[i][t]) for t in n_])
            out.append(z3.Implies(shared, reused))
    return z3.And(*out)


def no_active_eviction(enc: Encoding, tr: SymTransition) -> Term:
    """Only unreferenced objects are evicted or reclaimed; a running request's blocks stay put."""
    before, after, op, b = tr.before, tr.after, tr.op, enc.bounds
    n_, r_ = range(b.blocks), range(b.requests)
    target = [z3.And(op.kind != enc.num(RESET), op.req == enc.num(r)) for r in r_]
    live = [before.st[r] != enc.num(ABSENT) for r in r_]

    def reads(r: int, t: int) -> Term:
        return z3.Or(*[z3.And(enc.num(j) < before.nb[r], before.tab[r][j] == enc.num(t)) for j in n_])

    readers = [z3.Or(*[z3.And(live[r], z3.Not(target[r]), reads(r, t)) for r in r_]) for t in n_]
    out = [z3.Not(z3.And(z3.Or(tr.step.evicted[t], tr.step.reclaimed[t]), readers[t])) for t in n_]
    for r in r_:
        other = z3.And(live[r], z3.Not(target[r]))
        kept = [after.st[r] != enc.num(ABSENT), after.nb[r] == before.nb[r]]
        kept += [after.tab[r][j] == before.tab[r][j] for j in n_]
        content = [
            z3.Implies(
                z3.And(reads(r, t), is_object(before, t)),
                z3.And(is_object(after, t), same_key(before, after, t)),
            )
            for t in n_
        ]
        out.append(z3.Implies(other, z3.And(*kept, *content)))
        for j in n_:
            for t in n_:
                handed = z3.And(
                    target[r],
                    after.st[r] != enc.num(ABSENT),
                    enc.num(j) < after.nb[r],
                    after.tab[r][j] == enc.num(t),
                    z3.Not(z3.And(live[r], reads(r, t))),
                    readers[t],
                    z3.Not(z3.And(is_object(before, t), before.hashed[t])),
                )
                out.append(z3.Not(handed))
    return z3.And(*out)


def hit_keeps_key(enc: Encoding, tr: SymTransition) -> Term:
    """A prefix hit takes its cached block back with its key: each block an admission hit still carries the
    key it was found under (dropping it breaks the chain the request's next blocks are keyed from)."""
    before, after, op, b = tr.before, tr.after, tr.op, enc.bounds
    admitted = z3.And(z3.Or(op.kind == enc.num(ADMIT), op.kind == enc.num(RESUME)), tr.step.status == enc.num(OK))
    out = []
    for r in range(b.requests):
        for j in range(b.blocks):
            for t in range(b.blocks):
                hit = z3.And(
                    admitted,
                    op.req == enc.num(r),
                    enc.num(j) < tr.step.hit_blocks,
                    after.tab[r][j] == enc.num(t),
                    before.hashed[t],
                    before.klen[t] > enc.num(0),
                )
                kept = z3.And(after.hashed[t], after.klen[t] == before.klen[t], after.kbits[t] == before.kbits[t])
                out.append(z3.Implies(hit, kept))
    return z3.And(*out)


def atomic_failure(enc: Encoding, tr: SymTransition) -> Term:
    """A refused or rejected operation changes nothing observable and evicts nothing."""
    before, after, b = tr.before, tr.after, enc.bounds
    same = [z3.Not(z3.Or(*tr.step.evicted, *tr.step.reclaimed)), free_count(enc, before) == free_count(enc, after)]
    for t in range(b.blocks):
        view = z3.And(
            before.ref[t] == after.ref[t],
            same_key(before, after, t),
            before.fill[t] == after.fill[t],
            before.hits[t] == after.hits[t],
        )
        same.append(is_object(before, t) == is_object(after, t))
        same.append(z3.Implies(is_object(before, t), view))
        same.append(before.klen[t] == after.klen[t])
        same.append(z3.Implies(before.klen[t] > enc.num(0), before.kbits[t] == after.kbits[t]))
        same.append(z3.Implies(before.klen[t] > enc.num(0), before.lost[t] == after.lost[t]))
    for r in range(b.requests):
        present = before.st[r] != enc.num(ABSENT)
        request = z3.And(
            before.st[r] == after.st[r],
            before.tlen[r] == after.tlen[r],
            before.tbits[r] == after.tbits[r],
            before.nb[r] == after.nb[r],
            *[z3.Implies(enc.num(j) < before.nb[r], before.tab[r][j] == after.tab[r][j]) for j in range(b.blocks)],
        )
        same.append(z3.If(present, request, after.st[r] == enc.num(ABSENT)))
    return z3.Implies(tr.step.status != enc.num(OK), z3.And(*same))


def bad_input_rejected(enc: Encoding, tr: SymTransition) -> Term:
    """Bad input gets the spec's error; valid input never does."""
    return (tr.step.status == enc.num(INVALID)) == z3.Not(enc.valid(tr.before, tr.op))


_FORMULAS: dict[str, TransitionFormula] = {
    f.__name__: f
    for f in (
        capacity_conservation,
        non_negative_ref_counts,
        ref_count_matches_references,
        no_active_eviction,
        hit_keeps_key,
        atomic_failure,
        share_without_duplication,
        tail_rounding,
        cache_index_consistency,
        bad_input_rejected,
    )
}

SAFETY: dict[str, TransitionFormula] = {
    inv.name: _FORMULAS[inv.name]
    for inv in INVARIANTS
    if inv.kind == "safety" and inv not in VIEW_INVARIANTS and inv not in LOST_HIT_INVARIANTS
}
"""Every safety invariant of spec.invariants but those over a view beside the ledger (VIEW_INVARIANTS: the
encoding has no radix tree, and one table per request with no window) and the lost-hit checks
(LOST_HIT_INVARIANTS: not encoded yet, see there), by the same name, in the same order (a new one without a Z3
twin fails here, at import)."""


# -- auxiliary invariants (strengthening for induction) ------------------------------------------------


def well_formed(enc: Encoding, s: SymState) -> Term:
    """Every field is in its domain and in canonical form (masked token strings, sentinel past a table's end)."""
    b = enc.bounds
    zero, n = enc.num(0), enc.num(b.blocks)
    out = []
    for t in range(b.blocks):
        out += [
            s.klen[t] >= zero,
            s.klen[t] <= n,
            s.kbits[t] == enc.masked(s.kbits[t], s.klen[t] * enc.num(b.block_size)),
            s.pos[t] >= enc.num(-1),
            s.pos[t] < n,
            s.ref[t] >= zero,
            s.ref[t] <= enc.num(b.requests),
            s.fill[t] >= zero,
            s.fill[t] <= enc.num(b.block_size),
        ]
    for r in range(b.requests):
        out += [
            s.st[r] >= zero,
            s.st[r] <= enc.num(PREEMPTED),
            s.tlen[r] >= zero,
            s.tlen[r] <= enc.num(b.max_tokens),
            s.tbits[r] == enc.masked(s.tbits[r], s.tlen[r]),
            s.nb[r] >= zero,
            s.nb[r] <= n,
            z3.Implies(s.st[r] == enc.num(ABSENT), z3.And(s.tlen[r] == zero, s.tbits[r] == enc.bits(0))),
            z3.Implies(s.st[r] != enc.num(ABSENT), s.tlen[r] >= enc.num(1)),
            z3.Implies(s.st[r] != enc.num(RUNNING), s.nb[r] == zero),
            z3.Implies(s.st[r] == enc.num(RUNNING), s.nb[r] == enc.ceil_div(s.tlen[r])),
        ]
        for j in range(b.blocks):
            inside = enc.num(j) < s.nb[r]
            out.append(z3.If(inside, z3.And(s.tab[r][j] >= zero, s.tab[r][j] < n), s.tab[r][j] == n))
    return z3.And(*out)


def queue_holds_the_unreferenced(enc: Encoding, s: SymState) -> Term:
    """The free queue holds exactly the unreferenced slots, at distinct dense positions."""
    b = enc.bounds
    zero = enc.num(0)
    qlen = enc.count([p >= zero for p in s.pos])
    out = []
    for t in range(b.blocks):
        out.append((s.pos[t] >= zero) == (s.ref[t] == zero))
        out.append(s.pos[t] < qlen)
        for u in range(t + 1, b.blocks):
            out.append(z3.Implies(s.pos[t] >= zero, s.pos[t] != s.pos[u]))
    return z3.And(*out)


def refs_are_counted(enc: Encoding, s: SymState) -> Term:
    """Each slot's ref count is the number of table entries that name it."""
    return z3.And(*[s.ref[t] == references(enc, s, t) for t in range(enc.bounds.blocks)])


def keys_are_sound(enc: Encoding, s: SymState) -> Term:
    """A slot carries exactly its key; index entries are unique (lost duplicates apart, and only under
    duplicate_keys="newest"); only full blocks of their own prefix carry one."""
    b = enc.bounds
    zero = enc.num(0)
    out = []
    for t in range(b.blocks):
        out.append(s.hashed[t] == (s.klen[t] > zero))
        out.append(z3.Implies(s.lost[t], s.hashed[t]) if enc.duplicate_keys == "newest" else z3.Not(s.lost[t]))
        for u in range(t + 1, b.blocks):
            both = z3.And(enc.entry(s, t), enc.entry(s, u))
            out.append(z3.Implies(both, z3.Not(z3.And(s.klen[t] == s.klen[u], s.kbits[t] == s.kbits[u]))))
    out += [_held_keys_match(enc, s, r, j) for r in range(b.requests) for j in range(b.blocks)]
    return z3.And(*out)


def unkeyed_blocks_are_private(enc: Encoding, s: SymState) -> Term:
    """A block without a key is referenced at most once."""
    return z3.And(*[z3.Implies(z3.Not(s.hashed[t]), s.ref[t] <= enc.num(1)) for t in range(enc.bounds.blocks)])


def fill_matches_position(enc: Encoding, s: SymState) -> Term:
    """A held block holds min(B, tokens left) tokens; a cached-free one is full; an empty one holds 0 and no hits."""
    b = enc.bounds
    zero = enc.num(0)
    out = []
    for t in range(b.blocks):
        out.append(z3.Implies(z3.And(s.ref[t] == zero, s.hashed[t]), s.fill[t] == enc.num(b.block_size)))
        unused = z3.And(s.ref[t] == zero, z3.Not(s.hashed[t]))
        out.append(z3.Implies(unused, z3.And(s.fill[t] == zero, s.hits[t] == zero)))
    for r in range(b.requests):
        for j in range(b.blocks):
            held = enc.num(j) < s.nb[r]
            fill = slot_field(enc, s.fill, s.tab[r][j])
            out.append(z3.Implies(held, fill == enc.tokens_in_block(s.tlen[r], enc.num(j))))
    return z3.And(*out)


AUXILIARY: dict[str, StateFormula] = {
    "well_formed": well_formed,
    "queue_holds_the_unreferenced": queue_holds_the_unreferenced,
    "refs_are_counted": refs_are_counted,
    "keys_are_sound": keys_are_sound,
    "unkeyed_blocks_are_private": unkeyed_blocks_are_private,
    "fill_matches_position": fill_matches_position,
}
"""Facts about every reachable state; together they are 1-inductive (see spec.formal.bmc.prove)."""


def auxiliary(enc: Encoding, s: SymState) -> Term:
    return z3.And(*[f(enc, s) for f in AUXILIARY.values()])
