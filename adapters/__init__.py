"""Adapters: one module per implementation under test, found by name, dotted path or entry point.

The kit's own adapters are listed once, in ``BUILTIN``; other packages add theirs as entry
points of the ``kvspec.adapters`` group.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from kvspec.adapter import AdapterFactory
from kvspec.dotted import DottedPathError, import_object

BUILTIN: dict[str, str] = {
    "reference": "kvspec.adapters.reference_paged:ReferencePagedAdapter",
    "reference-score": "kvspec.adapters.reference_paged:ReferenceScoreAdapter",
    "reference-shared-aware": "kvspec.adapters.reference_paged:ReferenceSharedAwareAdapter",
    "reference-family-protect": "kvspec.adapters.reference_paged:ReferenceFamilyProtectAdapter",
    "reference-newest": "kvspec.adapters.reference_paged:ReferenceNewestAdapter",
    "lifecycle-sim": "kvspec.adapters.lifecycle_sim:LifecycleSimAdapter",
    "scheduler-sim": "kvspec.adapters.scheduler_sim:SchedulerSimAdapter",
    "vllm": "kvspec.adapters.vllm_inprocess:VllmAdapter",
    "vllm-blockpool": "kvspec.adapters.vllm_blockpool:VllmBlockPoolAdapter",
    "vllm-hybrid-sliding": "kvspec.adapters.vllm_hybrid:sliding",
    "vllm-sliding": "kvspec.adapters.vllm_hybrid:sliding_only",
    "vllm-hybrid-local": "kvspec.adapters.vllm_hybrid:local",
    "vllm-hybrid-mixed": "kvspec.adapters.vllm_hybrid:mixed",
    "vllm-hybrid-sizes": "kvspec.adapters.vllm_hybrid:sizes",
    "vllm-hybrid-sliding-eagle": "kvspec.adapters.vllm_hybrid:sliding_eagle",
    "vllm-hybrid-sizes-eagle": "kvspec.adapters.vllm_hybrid:sizes_eagle",
    "vllm-live": "kvspec.adapters.vllm_live.adapter:VllmLiveAdapter",
    "nano-vllm": "kvspec.adapters.nano_vllm:NanoVllmAdapter",
    "sglang": "kvspec.adapters.sglang_inprocess:SglangAdapter",
    "sglang-lfu": "kvspec.adapters.sglang_inprocess:lfu",
    "sglang-fifo": "kvspec.adapters.sglang_inprocess:fifo",
    "sglang-priority": "kvspec.adapters.sglang_inprocess:priority",
}

ENTRY_POINT_GROUP = "kvspec.adapters"


class AdapterLoadError(Exception):
    """The named adapter could not be found or imported."""


class UnknownAdapter(AdapterLoadError):
    """No adapter has that name (and it is no 'pkg.module:Factory' path): a usage error."""


def available() -> dict[str, str]:
    """Adapter name -> dotted path, built-ins first, then installed entry points."""
    found = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def _import(path: str) -> AdapterFactory:
    try:
        factory = import_object(path, "package.module:Factory")
    except DottedPathError as exc:
        raise AdapterLoadError(str(exc)) from exc
    if not callable(factory):
        raise AdapterLoadError(f"{path!r} is not callable")
    return factory


def load(name_or_path: str) -> AdapterFactory:
    """A factory for the adapter called ``name_or_path``: a known name or 'pkg.module:Factory'."""
    known = available()
    if name_or_path in known:
        return _import(known[name_or_path])
    if ":" in name_or_path:
        return _import(name_or_path)
    raise UnknownAdapter(f"unknown adapter {name_or_path!r}; known: {', '.join(sorted(known))}")


__all__ = [
    "BUILTIN",
    "AdapterFactory",
    "AdapterLoadError",
    "UnknownAdapter",
    "available",
    "load",
]
