"""The named invariants of the KV lifecycle, and THE registry that runs them.

Each is a function over one transition (before, op, outcome, events, after),
by kind: safety (every implementation), refinement (the spec's own step, for
implementations that declare exact semantics) and policy (the declared
eviction order and admission rules). ``KeyMemory`` carries what the checks
learn across transitions; ``PolicyQuality`` measures an eviction order, it is
no verdict.
"""

from __future__ import annotations

from .key_memory import KeyMemory
from .policy import candidates_unreferenced, no_spurious_refusal, policy_conformance
from .quality import PolicyQuality, eviction_choices, orphaned_blocks
from .refinement import predicted_admission, predicted_eviction, predicted_free_capacity, predicted_prefix_hits
from .safety import (
    atomic_failure,
    bad_input_rejected,
    cache_index_consistency,
    capacity_conservation,
    no_active_eviction,
    non_negative_ref_counts,
    ref_count_matches_references,
    share_without_duplication,
    tail_rounding,
)
from .transition import Invariant, Kind, Problems, Transition

# Order matters only for which broken invariant a report names first: the most
# specific cause comes before the generic symptoms it also produces.
INVARIANTS: tuple[Invariant, ...] = (
    Invariant("bad_input_rejected", "safety", bad_input_rejected),
    Invariant("atomic_failure", "safety", atomic_failure),
    Invariant("no_active_eviction", "safety", no_active_eviction),
    Invariant("share_without_duplication", "safety", share_without_duplication),
    Invariant("tail_rounding", "safety", tail_rounding),
    Invariant("cache_index_consistency", "safety", cache_index_consistency),
    Invariant("non_negative_ref_counts", "safety", non_negative_ref_counts),
    Invariant("ref_count_matches_references", "safety", ref_count_matches_references),
    Invariant("capacity_conservation", "safety", capacity_conservation),
    Invariant("predicted_admission", "refinement", predicted_admission),
    Invariant("predicted_eviction", "refinement", predicted_eviction),
    Invariant("predicted_prefix_hits", "refinement", predicted_prefix_hits),
    Invariant("predicted_free_capacity", "refinement", predicted_free_capacity),
    # Policy checks come last, so that adding them changed no existing counterexample's first name.
    Invariant("candidates_unreferenced", "policy", candidates_unreferenced),
    Invariant("no_spurious_refusal", "policy", no_spurious_refusal),
    Invariant("policy_conformance", "policy", policy_conformance),
)

ADAPTER_CONTRACT = "adapter_contract"
"""Not an invariant of the ledger: the adapter raised or hung where the spec defines an outcome."""

INVARIANT_NAMES: tuple[str, ...] = (*(i.name for i in INVARIANTS), ADAPTER_CONTRACT)


def check_transition(t: Transition) -> dict[str, Problems]:
    """Run every invariant on one transition: name -> None (not applicable) or problems.

    Afterwards ``t.memory`` learns what the next transition's policy checks need.
    """
    results = {inv.name: inv.check(t) for inv in INVARIANTS}
    t.memory.track(t)
    return results


__all__ = [
    "ADAPTER_CONTRACT",
    "INVARIANTS",
    "INVARIANT_NAMES",
    "Invariant",
    "KeyMemory",
    "Kind",
    "PolicyQuality",
    "Problems",
    "Transition",
    "check_transition",
    "eviction_choices",
    "orphaned_blocks",
]
