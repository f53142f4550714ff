"""The executable spec of the KV-cache block lifecycle.

It imports nothing of the rest of the kit: it is the model and knows no
implementation.
"""

from .invariants import INVARIANT_NAMES, INVARIANTS, Invariant, KeyMemory, Transition, check_transition
from .model import LedgerModel, Step, retention_score, validate
from .observation import ObjectView, Observation, RequestView
from .ops import Config, Event, Op, Outcome, Semantics, SpecError, blocks_for, size_of

__all__ = [
    "INVARIANTS",
    "INVARIANT_NAMES",
    "Config",
    "Event",
    "Invariant",
    "KeyMemory",
    "LedgerModel",
    "ObjectView",
    "Observation",
    "Op",
    "Outcome",
    "RequestView",
    "Semantics",
    "SpecError",
    "Step",
    "Transition",
    "blocks_for",
    "check_transition",
    "retention_score",
    "size_of",
    "validate",
]
