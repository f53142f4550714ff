"""tinyengine's kvspec adapter, registered under the ``kvspec.adapters`` entry point group."""

from __future__ import annotations

from kvspec.adapter import Capabilities, Semantics
from kvspec.adapters.reference_paged import ReferencePagedAdapter

from .allocator import Allocator


class TinyEngineAdapter(ReferencePagedAdapter):
    """Drives tinyengine's Allocator; the translation is the reference adapter's (same pool interface)."""

    name = "tinyengine"
    capabilities = Capabilities(
        semantics=Semantics(granularity="block", eviction="lru", hit_cap=True, reset_requires_idle=True, exact=True),
        version="tinyengine 0.1.0",
    )

    def __init__(self) -> None:
        super().__init__(lambda config: Allocator(config.capacity, config.block_size, hit_cap=True))
