"""The adapter contract's types: how an adapter's answers break them.

An adapter is user code: its outcome, events, observation and delta are checked for their types before the
kit judges them. The harness reports these problems as ``adapter_contract``; the isolation child reads
:func:`malformed_observation` too, so that it vouches for an observation it does not send
(adapters/kept.py) only where the harness would have found nothing wrong with it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from itertools import chain
from operator import attrgetter

from kvspec.spec import Event, ObjectView, Observation, ObservationDelta, Outcome, RequestView

_COUNTS = attrgetter("size", "tokens", "ref_count")
_INT = frozenset({int})


def malformed_answers(outcome: object, events: object) -> list[str]:
    """How an op's outcome and events break the contract's types (an Outcome, a list of Events)."""
    problems = []
    if not isinstance(outcome, Outcome):
        problems.append(f"returned {outcome!r}, not an Outcome")
    if not isinstance(events, list) or not all(isinstance(e, Event) for e in events):
        problems.append(f"events() returned {short(events)}, not a list of Events")
    return problems


def malformed_observation(obs: object) -> list[str]:
    """How an observation breaks the contract's types (an Observation of int counts, ObjectViews, RequestViews)."""
    if not isinstance(obs, Observation):
        return [f"observe() returned {short(obs)}, not an Observation"]
    problems = []
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (obs.capacity, obs.free)):
        problems.append(f"capacity {obs.capacity!r} and free {obs.free!r} must be ints")
    problems += _malformed_views(obs.objects, obs.requests, whose="")
    index: object = obs.index  # user code: the annotation promises nothing
    if index is not None and not isinstance(index, Mapping):
        problems.append("index must be a mapping or None")
    return problems


def _malformed_views(objects: object, requests: object, whose: str) -> list[str]:
    """How an observation's or a delta's (``whose``) objects and requests break the contract's types."""
    problems = []
    if not isinstance(objects, Mapping) or not _all_of(ObjectView, objects.values()):
        problems.append(f"{whose}objects must map oids to ObjectViews")
    elif not _counts_are_ints(objects.values()):
        problems.append("an ObjectView's size, tokens and ref_count must be ints")
    if not isinstance(requests, Mapping) or not _all_of(RequestView, requests.values()):
        problems.append(f"{whose}requests must map request ids to RequestViews")
    return problems


def _all_of(kind: type, values: Collection[object]) -> bool:
    """Every value is a ``kind``. The exact ``type(v) is kind`` of the common case is read at C speed
    (a whole pool's views at every K-th step); a subclass takes the per-value isinstance."""
    return set(map(type, values)) <= {kind} or all(isinstance(v, kind) for v in values)


def _counts_are_ints(views: Collection[ObjectView]) -> bool:
    """Every view's size, tokens and ref_count is an int, not a bool: the types of every count in one set built
    at C speed (a whole pool's views at every K-th step, five views on a ci step: one pass, no per-view frame);
    a subclass of int takes the per-count isinstance."""
    if set(map(type, chain.from_iterable(map(_COUNTS, views)))) <= _INT:
        return True
    return all(isinstance(n, int) and not isinstance(n, bool) for o in views for n in (o.size, o.tokens, o.ref_count))


def malformed(outcome: object, events: object, obs: object) -> list[str]:
    """How the adapter's answers break the contract's types (an Outcome, a list of Events, an Observation)."""
    return [*malformed_answers(outcome, events), *malformed_observation(obs)]


def malformed_delta(outcome: object, events: object, delta: ObservationDelta) -> list[str]:
    """How a delta step's answers break the contract's types: those of :func:`malformed`, on the delta's part
    (the objects and requests the step changed, never the whole pool)."""
    problems = malformed_answers(outcome, events)
    if not isinstance(delta.free, int) or isinstance(delta.free, bool):
        problems.append(f"the delta's free {delta.free!r} must be an int")
    problems += _malformed_views(delta.objects, delta.requests, whose="the delta's ")
    index: object = delta.index  # user code: the annotation promises nothing
    if not isinstance(index, Mapping):
        problems.append("the delta's index must be a mapping")
    return problems


def short(value: object) -> str:
    """``repr(value)``, cut to 120 characters."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


__all__ = ["malformed", "malformed_answers", "malformed_delta", "malformed_observation", "short"]
