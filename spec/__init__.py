"""The executable spec of the KV-cache block lifecycle.

It imports nothing of the rest of the kit: it is the model and knows no implementation. This
package names the spec's vocabulary (an op and its outcome, the pool, the declared semantics, what
an implementation shows) and its registry of invariants; the ledgers (``kvspec.spec.ledger``), the
invariants by kind (``kvspec.spec.invariants``), the eviction orders (``kvspec.spec.policies``), the
stream ledger of a live server (``kvspec.spec.stream``) and the formal side (``kvspec.spec.formal``)
are imported from their own modules. An adapter imports ``kvspec.adapter``.
"""

from .block_key import BlockKey
from .delta import ObservationDelta
from .invariants import INVARIANT_NAMES, INVARIANTS, Invariant
from .observation import ObjectView, Observation, RequestView
from .ops import Config, Event, Op, Outcome, Semantics, SpecError

__all__ = [
    "INVARIANTS",
    "INVARIANT_NAMES",
    "BlockKey",
    "Config",
    "Event",
    "Invariant",
    "ObjectView",
    "Observation",
    "ObservationDelta",
    "Op",
    "Outcome",
    "RequestView",
    "Semantics",
    "SpecError",
]
