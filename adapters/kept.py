"""The isolation child's copy of the state the harness keeps from an adapter's deltas.

Taking deltas, the harness (stateful_tests/harness.py) keeps the adapter's whole observation itself
(``Harness.kept``, a :class:`~kvspec.spec.KeptObservation`) and, every K steps and at the end of an example,
compares it with the adapter's full observation. Sending that observation from the adapter's child process
costs what the pool holds (about a second at 65,536 blocks: pickling tens of thousands of ObjectViews), so
the child keeps a :class:`KeptState` fed the same answers, compares there, and sends the observation only
when it differs (or cannot be vouched for); otherwise it sends :class:`Agreed`, and the harness judges the
whole-state invariants on its own kept state, which then equals the observation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvspec.adapter import Observation, ObservationDelta
from kvspec.adapter.answers import malformed_observation
from kvspec.spec.delta import KeptObservation, differences


@dataclass(frozen=True)
class Agreed:
    """The child's answer instead of the adapter's full observation: the state kept from the deltas equals it
    (:func:`~kvspec.spec.delta.differences` finds nothing, and its types are well formed). ``extra``: the
    observation's ``extra``, which the deltas may leave out and both sides take from the observation."""

    extra: Mapping[str, object]


class KeptState:
    """The state the harness keeps from the adapter's deltas, replayed in the child.

    The rule, the same as ``Harness.kept``'s, call for call (the harness drives both):

    - :meth:`start` (the example's first observation, ``IsolatedAdapter.observe_keeping``): kept := it;
    - a delta step (``step(op, "delta")``): the adapter's delta applied; where it gave none, kept := the
      observation sent instead;
    - a compared step (``step(op, "compared")``): where the adapter gave no delta, kept := its observation,
      which is sent; else the delta applied, then as at an end;
    - an end (``IsolatedAdapter.observe_compared``) and the rest of a compared step: kept compared with the
      adapter's observation; equal, kept keeps its mappings and takes the observation's ``extra``
      (:class:`Agreed` is sent); else kept := the observation, which is sent;
    - a reset of the adapter, or anything the child cannot apply: nothing kept, so the next comparison sends
      the observation (the harness then compares and restarts from it itself);
    - a step the harness answers itself (bad input it rejects for an adapter that leaves input checking to
      the kit: the adapter is not called, its state unchanged) and a ``full`` step: kept unchanged.

    Where the observation is sent, the harness's kept state afterwards equals it in every field the
    comparison reads, whichever way its own comparison goes; so both sides hold equal states at every call.
    """

    def __init__(self) -> None:
        self.state: KeptObservation | None = None

    def drop(self) -> None:
        self.state = None

    def start(self, obs: object) -> None:
        """Keep ``obs`` (an observation the harness keeps too); nothing, when it is not a well-formed one."""
        self.state = None
        if not malformed_observation(obs):
            try:
                self.state = KeptObservation(obs)  # type: ignore[arg-type]
            except Exception:  # well-typed at the top, yet not keepable (an unhashable oid): send it next time
                self.state = None

    def apply(self, delta: object) -> None:
        """A delta step's answer: the delta applied, or (an observation sent instead) kept := it."""
        if self.state is None:
            return
        if not isinstance(delta, ObservationDelta):
            self.start(delta)
            return
        try:
            self.state.apply(delta)
        except Exception:  # the harness finds the delta wrong too and stops the example
            self.state = None

    def compare(self, delta: object, obs: object, *, end: bool = False) -> Agreed | None:
        """Whether the adapter's observation ``obs`` need not be sent, at a compared step (``delta``: the step's
        delta, applied first; not a delta: the adapter gave none, so ``obs`` is sent and kept) or at the end of
        an example (``end``: nothing applied): :class:`Agreed` where the kept state equals ``obs``; None: send
        ``obs``, which is kept from now on."""
        if not end:
            if not isinstance(delta, ObservationDelta):
                self.start(obs)
                return None
            self.apply(delta)
        live = self.state
        if live is not None and not malformed_observation(obs):
            assert isinstance(obs, Observation)
            try:
                same = not differences(live.now(), obs, limit=1)
            except Exception:
                same = False
            if same:
                live.extra = obs.extra
                return Agreed(obs.extra)
        self.start(obs)
        return None


__all__ = ["Agreed", "KeptState"]
