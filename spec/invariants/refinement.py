"""Refinement checks: the implementation does what the spec's own step predicts.

They apply to implementations that declare exact semantics (``Transition.predicted`` is set).
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter

from .transition import ONE_TABLE, Invariant, Problems, Transition

_KEY = attrgetter("key")


def predicted_admission(t: Transition) -> Problems:
    """An operation succeeds exactly when the spec says it fits (no spurious refusal)."""
    p = t.predicted
    if p is None or p.outcome.status == "invalid":
        return None
    if p.outcome.status != t.outcome.status:
        why = "capacity was really there" if p.outcome.status == "ok" else "it does not fit"
        return [f"{t.op} was {t.outcome.status!r}, spec says {p.outcome.status!r} ({why})"]
    return []


def predicted_prefix_hits(t: Transition) -> Problems:
    """An admission serves exactly as many prompt tokens from cache as the spec predicts."""
    p = t.predicted
    if p is None or t.op.op not in ("admit", "resume") or t.outcome.hit_tokens is None:
        return None
    if p.outcome.status != "ok" or t.outcome.status != "ok":
        return None
    if p.outcome.hit_tokens != t.outcome.hit_tokens:
        return [f"{t.op} hit {t.outcome.hit_tokens} cached tokens, spec predicts {p.outcome.hit_tokens}"]
    return []


def predicted_free_capacity(t: Transition) -> Problems:
    """Free capacity after each step is what the spec predicts."""
    p = t.predicted
    if p is None:
        return None
    if p.free != t.after.free:
        return [f"free capacity after {t.op} is {t.after.free}, spec predicts {p.free}"]
    return []


def predicted_eviction(t: Transition) -> Problems:
    """The objects evicted and reclaimed are exactly those the declared policy picks."""
    p = t.predicted
    if p is None:
        return None
    if not p.evicted and not p.reclaimed and not any(e.kind in ("evict", "reclaim") for e in t.events):
        return []  # nothing picked, nothing left: the counts below agree (most steps)
    problems = []
    for kind, want in (("evict", p.evicted), ("reclaim", p.reclaimed)):
        got = []
        for e in t.events:
            if e.kind != kind:
                continue
            obj = t.before.objects.get(e.oid)
            key = e.key if e.key is not None else (obj.key if obj is not None else None)
            content = t.memory.content_of(key, t.semantics) if key is not None else None
            got.append(content)
        if Counter(got) != Counter(want):
            problems.append(f"{t.op}: {kind}ed {len(got)} object(s) {_short(got)}, spec's policy picks {_short(want)}")
    return problems


def index_completeness(t: Transition) -> Problems:
    """Every cached key a lookup should find is found: the blocks whose key is in no index entry (lost hits:
    capacity no lookup can hit) are exactly those the spec's own index loses.

    Judged by content: a block's key stands for the prefix KeyMemory learned for it. With
    duplicate_keys="newest" the spec loses a key when its owner leaves the cache while an older duplicate
    still holds it; under every other choice it loses none.
    """
    p, index = t.predicted, t.after.index
    if p is None or index is None or t.semantics.granularity != "block":
        return None
    if not p.lost and type(index) is dict:  # the common case, a whole pool at every K-th step: at C speed
        keys = set(map(_KEY, t.after.objects.values()))
        keys.discard(None)
        if not keys - index.keys():
            return []
    held = [(oid, o.key) for oid, o in t.after.objects.items() if o.key is not None and o.key not in index]
    if not held and not p.lost:
        return []  # no key lost on either side (most steps)
    got: Counter[object] = Counter(t.memory.content_of(key, t.semantics) for _, key in held)
    want: Counter[object] = Counter(p.lost)
    if got == want or (None in got and sum(got.values()) == sum(want.values())):
        return []
    problems = []
    lost_here = [(oid, key) for oid, key in held if t.memory.content_of(key, t.semantics) not in want]
    if lost_here:
        oids = [oid for oid, _ in lost_here]
        problems.append(f"after {t.op}, block(s) {oids!r} hold a cached key that no index entry finds (lost hits)")
    extra = want - got
    if extra:
        problems.append(f"after {t.op}, the index finds {sum(extra.values())} key(s) the spec's index has lost")
    return problems


def _short(contents: object) -> str:
    text = repr(contents)
    return text if len(text) < 160 else text[:157] + "..."


# incremental=True: they compare the spec's prediction with the step's outcome, events and free capacity and
# look objects up; none iterates the state. index_completeness counts every held key: a whole-state check.
REFINEMENT: tuple[Invariant, ...] = (
    Invariant("index_completeness", "refinement", index_completeness, frozenset({"block"}), ONE_TABLE),
    Invariant("predicted_admission", "refinement", predicted_admission, layouts=ONE_TABLE, incremental=True),
    Invariant("predicted_eviction", "refinement", predicted_eviction, layouts=ONE_TABLE, incremental=True),
    Invariant("predicted_prefix_hits", "refinement", predicted_prefix_hits, layouts=ONE_TABLE, incremental=True),
    Invariant("predicted_free_capacity", "refinement", predicted_free_capacity, layouts=ONE_TABLE, incremental=True),
)
