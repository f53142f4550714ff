"""The executable spec of the KV-cache block lifecycle.

It imports nothing of the rest of the kit: it is the model and knows no
implementation.
"""

from .block_key import BlockKey, Prefix, block_keys
from .delta import LiveObservation, ObservationDelta
from .invariants import INVARIANT_NAMES, INVARIANTS, Invariant, KeyMemory, Transition, check_transition
from .ledger import BlockLedger, EntryLedger, LedgerModel, RecordLedger, Step, validate
from .observation import ObjectView, Observation, RequestView
from .ops import Config, Event, Op, Outcome, Semantics, SpecError, blocks_for, size_of
from .policies import BLOCK_ORDERS, BlockFeatures, OrderParams, order_key, retain_score, retention_score

__all__ = [
    "BLOCK_ORDERS",
    "INVARIANTS",
    "INVARIANT_NAMES",
    "Config",
    "BlockFeatures",
    "BlockKey",
    "BlockLedger",
    "EntryLedger",
    "Event",
    "Invariant",
    "KeyMemory",
    "LedgerModel",
    "LiveObservation",
    "ObjectView",
    "Observation",
    "ObservationDelta",
    "Op",
    "OrderParams",
    "Outcome",
    "Prefix",
    "RecordLedger",
    "RequestView",
    "Semantics",
    "SpecError",
    "Step",
    "Transition",
    "block_keys",
    "blocks_for",
    "check_transition",
    "order_key",
    "retain_score",
    "retention_score",
    "size_of",
    "validate",
]
