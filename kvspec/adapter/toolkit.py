"""What a block-level adapter of a new engine needs besides its translation (docs/writing-an-adapter.md).

Three helpers, each for one thing most engines lack:

- :func:`import_without_init`: an engine's allocator modules, imported without running its package's
  ``__init__`` (which usually imports torch, a model runner, CUDA kernels).
- :func:`append_atomically`: the spec's multi-token ``append`` is all or nothing; an engine that decodes one
  token at a time is asked for the whole capacity first, then fed token by token.
- :func:`derived_events`: evictions read off two successive observations, for an engine with no event
  stream.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Hashable, Iterable, Sequence

from kvspec.spec import Event, Observation, Outcome


def import_without_init(package: str, *modules: str) -> list[types.ModuleType]:
    """The submodules ``modules`` of ``package``, imported without executing ``package/__init__.py``.

    The package is registered as an empty module whose ``__path__`` is the installed package's, so its
    submodules resolve as usual. Safe only in a process that never needs the real package's ``__init__``
    (an adapter's own child process). Raises ImportError naming the package when it is not installed.
    """
    if package not in sys.modules:
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise ImportError(f"the package {package!r} is not installed in {sys.executable}")
        shell = types.ModuleType(package)
        shell.__path__ = list(found.submodule_search_locations)
        shell.__spec__ = found
        sys.modules[package] = shell
    return [importlib.import_module(f"{package}.{name}") for name in modules]


def append_atomically(
    tokens: Sequence[int], *, blocks_needed: int, free_blocks: int, append_one: Callable[[int], None]
) -> Outcome:
    """Append ``tokens`` one at a time, or none of them: refused before the first when the blocks they need
    (``blocks_needed``, new blocks past the request's tail) exceed the engine's own count of blocks it can
    hand out (``free_blocks``: free plus evictable)."""
    if blocks_needed > free_blocks:
        return Outcome.refused(f"{blocks_needed} new block(s) needed, {free_blocks} free")
    for token in tokens:
        append_one(token)
    return Outcome.ok()


def derived_events(before: Observation, after: Observation, taken: Iterable[Hashable] = ()) -> list[Event]:
    """The evictions between two observations of an engine that reports none: one ``evict`` per block that
    held a cache key before and holds no key, or another key, after; and per block in ``taken`` (the blocks
    the step took from the free pool as new blocks, not as hits) that held a key before, whatever it holds
    after (a block evicted and keyed again with the same prefix in one step).

    Order: the blocks in ``taken``, in the order given (the order the engine took them from its free
    pool), then the others in the order of ``before.objects``. Limits: that second order is not the
    engine's; a key dropped on purpose (a reclaim) reads as an eviction, so an adapter whose engine
    reclaims relabels those itself; a block that held a key only in the middle of a step is never seen.
    """
    fresh = dict.fromkeys(taken)
    order = [*fresh, *(oid for oid in before.objects if oid not in fresh)]
    events = []
    for oid in order:
        was = before.objects.get(oid)
        if was is None or was.key is None:
            continue
        now = after.objects.get(oid)
        if now is None or now.key != was.key or oid in fresh:
            events.append(Event("evict", oid, was.key))
    return events


__all__ = ["append_atomically", "derived_events", "import_without_init"]
