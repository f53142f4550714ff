"""The named invariants of the KV lifecycle, and THE registry that runs them.

Each is a function over one transition (before, op, outcome, events, after),
by kind: safety (every implementation), refinement (the spec's own step, for
implementations that declare exact semantics) and policy (the declared
eviction order and admission rules). ``KeyMemory`` carries what the checks
learn across transitions; ``PolicyQuality`` measures an eviction order, it is
no verdict.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..ops import Semantics
from .free_list import FREE_LIST_SAFETY
from .hybrid import HYBRID_SAFETY
from .key_memory import KeyMemory
from .lost_hits import LOST_HIT_POLICY, LOST_HIT_SAFETY
from .policy import POLICY
from .policy_quality import PolicyQuality, eviction_choices, orphaned_blocks
from .radix import RADIX_POLICY, RADIX_SAFETY
from .refinement import REFINEMENT
from .safety import SAFETY, STATE, WHOLE_TOO
from .transition import Invariant, Kind, Problems, Transition

INVARIANTS: tuple[Invariant, ...] = (
    *HYBRID_SAFETY,
    *RADIX_SAFETY,
    *SAFETY,
    *FREE_LIST_SAFETY,
    *LOST_HIT_SAFETY,
    *REFINEMENT,
    *POLICY,
    *LOST_HIT_POLICY,
    *RADIX_POLICY,
)
"""Every invariant, in the order a report names a step's broken invariants: safety first (within a kind,
the most specific cause before the generic symptoms it also produces), then refinement, then policy (last,
so that adding them changed no existing counterexample's first name). A new invariant is one function and
one entry in its kind's tuple. The radix ones (spec.invariants.radix) apply only to an adapter that shows a
RadixView; their safety checks come first, as the tree-level cause of the block-level symptoms. The hybrid
ones (spec.invariants.hybrid) apply only to an implementation that declares several KV cache groups
(Semantics.layout ``per_group``), and the checks that read one table per request only to the others. The
free-list one (spec.invariants.free_list) applies only to an adapter that shows its free list (a FreeListView);
it comes after the ledger's safety checks, whose names it leaves first where both fire. The lost-hit checks
(spec.invariants.lost_hits: judged against what the pool holds, not the index) come after those, so that adding
them renamed no earlier counterexample."""

RADIX_INVARIANTS: tuple[Invariant, ...] = (*RADIX_SAFETY, *RADIX_POLICY)
"""The invariants over a radix tree's RadixView (spec.radix_view): they apply only to adapters that show one, and
the block ledger's Z3 encoding, which has no tree, has no twin of them."""

HYBRID_INVARIANTS: tuple[Invariant, ...] = HYBRID_SAFETY
"""The invariants over a hybrid cache's HybridView (spec.kv_groups): they apply only to adapters that declare KV
cache groups; the block ledger's Z3 encoding has one table per request and no window, so it has no twin of them."""

FREE_LIST_INVARIANTS: tuple[Invariant, ...] = FREE_LIST_SAFETY
"""The invariant over an allocator's FreeListView (spec.free_list_view): it applies only to adapters that show one; the
block ledger's Z3 encoding counts free blocks and keeps no list, so it has no twin of it."""

LOST_HIT_INVARIANTS: tuple[Invariant, ...] = (*LOST_HIT_SAFETY, *LOST_HIT_POLICY)
"""The invariants judged against what the pool holds (spec.invariants.lost_hits). The block ledger's Z3 encoding
has no twin of them yet: its ``newest`` is the one-entry-per-hash index that forgets older copies (their lost hits
are what no_lost_hit reports), and its ``unkeyed`` drops an uncached duplicate's tokens on free; the Python spec
does neither (docs/formal.md)."""

VIEW_INVARIANTS: tuple[Invariant, ...] = (*RADIX_INVARIANTS, *HYBRID_INVARIANTS, *FREE_LIST_INVARIANTS)
"""The invariants that read what an adapter shows beside the ledger (a RadixView, a HybridView or a FreeListView)."""

ADAPTER_CONTRACT = "adapter_contract"
"""Not an invariant of the ledger: the adapter raised or hung where the spec defines an outcome."""

INVARIANT_NAMES: tuple[str, ...] = (*(i.name for i in INVARIANTS), ADAPTER_CONTRACT)
_LEDGER_NAMES = INVARIANT_NAMES[:-1]  # the invariants' names, in INVARIANTS' order


def check_transition(t: Transition, whole: Transition | None = None) -> dict[str, Problems]:
    """Run every invariant on one transition: name -> None (not applicable) or problems.

    On a delta step's local part (``t.touched`` set) only the incremental invariants run; the others are
    None there (not judged on this step) and judge the whole state every K steps and at the end of a run:
    ``whole``, the same step over the whole state (a K-th step), runs those that are not incremental and
    those whose local form needs a judged base (``WHOLE_TOO``), after the local ones and before KeyMemory
    learns the step. Afterwards ``t.memory`` learns what the next transition's policy checks need.
    """
    local = t.touched is not None
    results: dict[str, Problems] = dict.fromkeys(_LEDGER_NAMES)  # None: not applicable, or not judged this step
    if whole is None and not local:  # the whole state, every step: each applicable invariant judges it
        for name, check in _checks(t.semantics):
            results[name] = check(t)
        t.memory.track(t)
        return results
    for inv in applicable(t.semantics):
        problems = inv.check(t) if inv.incremental or not local else None
        if whole is not None and (not inv.incremental or inv.name in WHOLE_TOO):
            more = inv.check(whole)
            if more is not None:
                problems = [*(problems or []), *(p for p in more if p not in (problems or []))]
        results[inv.name] = problems
    t.memory.track(t, whole)
    return results


@functools.cache
def applicable(semantics: Semantics) -> tuple[Invariant, ...]:
    """The invariants that can be judged for an implementation declaring ``semantics``, in ``INVARIANTS``' order
    (``Invariant.applies``, asked once per semantics instead of once per invariant per step)."""
    return tuple(inv for inv in INVARIANTS if inv.applies(semantics))


@functools.cache
def _checks(semantics: Semantics) -> tuple[tuple[str, Callable[[Transition], Problems]], ...]:
    """``applicable(semantics)`` as (name, check) pairs: what a whole-state step runs, without attribute lookups."""
    return tuple((inv.name, inv.check) for inv in applicable(semantics))


def check_state(t: Transition) -> dict[str, Problems]:
    """Run the state invariants (``STATE``: they read ``t.after`` only) on a whole state; the others are None."""
    return {inv.name: inv.check(t) if inv.name in STATE and inv.applies(t.semantics) else None for inv in INVARIANTS}


__all__ = [
    "ADAPTER_CONTRACT",
    "FREE_LIST_INVARIANTS",
    "INVARIANTS",
    "INVARIANT_NAMES",
    "HYBRID_INVARIANTS",
    "Invariant",
    "KeyMemory",
    "LOST_HIT_INVARIANTS",
    "Kind",
    "PolicyQuality",
    "RADIX_INVARIANTS",
    "STATE",
    "Problems",
    "Transition",
    "VIEW_INVARIANTS",
    "applicable",
    "check_state",
    "check_transition",
    "eviction_choices",
    "orphaned_blocks",
]
