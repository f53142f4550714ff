"""Everything an adapter needs, in one import: ``from kvspec.adapter import Capabilities, Op, Outcome, ...``.

An adapter translates the spec's operations into one implementation's own calls and shows the
implementation's own state as an :class:`Observation` (docs/writing-an-adapter.md). It declares what it
can do and what it claims in :class:`Capabilities` (its :class:`Semantics` among them) and implements
:class:`Adapter` (in process), with :class:`DeltaAdapter` where it can say what a step changed, or
:class:`LiveAdapter` (a running server). The views beside the ledger (a radix tree, KV cache groups, a
free list) go under ``Observation.extra`` by their keys (``RADIX``, ``HYBRID``, ``FREE_LIST``). The
toolkit's three helpers are what most engines lack: importing an engine's allocator without its package's
``__init__``, an all-or-nothing multi-token append, and evictions read off two observations. A live
adapter keeps what it saw in a :class:`Recorder` and judges it with the spec's stream checks
(:class:`StreamCheck` over its :class:`RequestRecord` and :class:`MetricSnapshot` records and the published
event batches).
"""

from kvspec.spec.delta import ObservationDelta
from kvspec.spec.free_list_view import FREE_LIST, FreeListView
from kvspec.spec.kv_groups import HYBRID, AttentionKind, HybridView, KvGroup
from kvspec.spec.observation import ObjectView, Observation, RequestState, RequestView
from kvspec.spec.ops import OP_KINDS, Config, Event, EventKind, Op, OpKind, Outcome, Semantics, blocks_for
from kvspec.spec.radix_view import RADIX, RadixNode, RadixOrder, RadixView
from kvspec.spec.stream import MetricSnapshot, RequestRecord, StreamCheck, StreamResult

from .contract import (
    DECLINABLE,
    Adapter,
    AdapterFactory,
    Capabilities,
    DeltaAdapter,
    LiveAdapter,
    ServerInfo,
    ServerStartError,
)
from .recorder import Recorder
from .toolkit import append_atomically, derived_events, import_without_init

__all__ = [
    "DECLINABLE",
    "FREE_LIST",
    "HYBRID",
    "OP_KINDS",
    "RADIX",
    "Adapter",
    "AdapterFactory",
    "AttentionKind",
    "Capabilities",
    "Config",
    "DeltaAdapter",
    "Event",
    "EventKind",
    "FreeListView",
    "HybridView",
    "KvGroup",
    "MetricSnapshot",
    "LiveAdapter",
    "ObjectView",
    "Observation",
    "ObservationDelta",
    "Op",
    "OpKind",
    "Outcome",
    "RadixNode",
    "RadixOrder",
    "RadixView",
    "Recorder",
    "RequestRecord",
    "RequestState",
    "RequestView",
    "Semantics",
    "ServerInfo",
    "ServerStartError",
    "StreamCheck",
    "StreamResult",
    "append_atomically",
    "blocks_for",
    "derived_events",
    "import_without_init",
]
