"""Adapters that break the adapter contract in every way user code can: the reliability tests' cast.

Each is the reference adapter with one fault, reachable as ``faulty_adapters:NAME`` (tests/ is on
sys.path in pytest; subprocess runs set PYTHONPATH). A fault fires on the Nth call of a method:
apply, events and observe count from the last reset (so the saved case replays to the same fault),
reset and close over the adapter's life (so a check is under way when it happens).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.spec import Config, Event, Observation, Op, Outcome

FOREVER = 3600.0


class _Faulty(ReferencePagedAdapter):
    """The reference adapter; ``fault(method)`` decides what its Nth call of ``method`` does instead."""

    at: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def _due(self, method: str) -> bool:
        self.calls[method] = self.calls.get(method, 0) + 1
        return self.calls[method] == self.at.get(method, -1)

    PER_EXAMPLE = ("apply", "events", "observe")

    def fault(self) -> Any:
        raise NotImplementedError

    def reset(self, config: Config) -> None:
        for method in self.PER_EXAMPLE:
            self.calls.pop(method, None)
        if self._due("reset"):
            self.fault()
        super().reset(config)

    def apply(self, op: Op) -> Outcome:
        if self._due("apply"):
            return self.fault()  # type: ignore[no-any-return]
        return super().apply(op)

    def observe(self) -> Observation:
        if self._due("observe"):
            return self.fault()  # type: ignore[no-any-return]
        return super().observe()

    def events(self) -> list[Event]:
        if self._due("events"):
            return self.fault()  # type: ignore[no-any-return]
        return super().events()

    def close(self) -> None:
        if self._due("close"):
            self.fault()
        super().close()


class _Hang(_Faulty):
    def fault(self) -> Any:
        time.sleep(FOREVER)


# -- hangs ------------------------------------------------------------------------------------


class HangsInInit(ReferencePagedAdapter):
    def __init__(self) -> None:
        time.sleep(FOREVER)


class HangsInApply(_Hang):
    at: ClassVar[dict[str, int]] = {"apply": 4}


class HangsInObserve(_Hang):
    at: ClassVar[dict[str, int]] = {"observe": 4}


class HangsInFirstReset(_Hang):
    at: ClassVar[dict[str, int]] = {"reset": 1}


class HangsInClose(_Hang):
    at: ClassVar[dict[str, int]] = {"close": 1}


class HangsInFirstApply(_Hang):
    """Hangs on its very first op: in the coverage scenarios, which run before the random phase."""

    at: ClassVar[dict[str, int]] = {"apply": 1}


# -- what must never pass ----------------------------------------------------------------------


class _Raise(_Faulty):
    error: BaseException = Exception()

    def fault(self) -> Any:
        raise self.error


class ExitsZeroInApply(_Raise):
    at: ClassVar[dict[str, int]] = {"apply": 4}
    error = SystemExit(0)


class InterruptsInApply(_Raise):
    at: ClassVar[dict[str, int]] = {"apply": 4}
    error = KeyboardInterrupt()


class GeneratorExitInApply(_Raise):
    at: ClassVar[dict[str, int]] = {"apply": 4}
    error = GeneratorExit()


class OsExitInApply(_Faulty):
    at: ClassVar[dict[str, int]] = {"apply": 4}

    def fault(self) -> Any:
        os._exit(0)


# -- faults during the run -----------------------------------------------------------------------


class ObserveRaises(_Raise):
    at: ClassVar[dict[str, int]] = {"observe": 4}
    error = RuntimeError("the block table is being rebuilt")


class ObserveReturnsADict(_Faulty):
    at: ClassVar[dict[str, int]] = {"observe": 4}

    def fault(self) -> Any:
        return {"capacity": 8, "free": 8}


class EventsReturnsNone(_Faulty):
    at: ClassVar[dict[str, int]] = {"events": 4}

    def fault(self) -> Any:
        return None


class ObservationOfWrongTypes(_Faulty):
    at: ClassVar[dict[str, int]] = {"observe": 4}

    def fault(self) -> Any:
        obs = ReferencePagedAdapter.observe(self)
        return Observation(str(obs.capacity), obs.free, obs.objects, obs.requests, obs.index)  # type: ignore[arg-type]


class ResetRaisesLater(_Raise):
    """Starts fine, then an example's reset fails: a finding, not 'could not run'."""

    at: ClassVar[dict[str, int]] = {"reset": 5}
    error = RuntimeError("pool allocation failed")


class ObserveRaisesAtStart(_Raise):
    at: ClassVar[dict[str, int]] = {"observe": 1}
    error = RuntimeError("no block table yet")


# -- slow ones, to be interrupted ------------------------------------------------------------------


class SlowBuggy(ReferencePagedAdapter):
    """A real bug (a released block's ref count is decremented twice), 100 ms a step: found in a second or two,
    then shrunk and replayed for many seconds more. With ``SLOW_BUGGY_MARK`` set, the first release that fires
    the bug (the kit reports it on that step) creates that file: a test can signal the kit while it shrinks."""

    def __init__(self) -> None:
        from seeded_bugs import DoubleDecrement

        super().__init__(lambda c: DoubleDecrement(c.capacity, c.block_size))

    def apply(self, op: Op) -> Outcome:
        time.sleep(0.1)
        outcome = super().apply(op)
        mark = os.environ.get("SLOW_BUGGY_MARK")
        if mark and op.op == "release" and outcome.status == "ok":
            Path(mark).touch()
        return outcome


class SlowClose(ReferencePagedAdapter):
    """Takes 20 s to close (within a 30 s step timeout): a second Ctrl-C must not wait for it."""

    def apply(self, op: Op) -> Outcome:
        time.sleep(0.01)
        return super().apply(op)

    def close(self) -> None:
        time.sleep(20)


class RaiseClose(ReferencePagedAdapter):
    """Every call but close() is clean; close() raises."""

    def close(self) -> None:
        raise RuntimeError("close failed")


class ApplyReturnsNone(ReferencePagedAdapter):
    def apply(self, op):  # type: ignore[no-untyped-def]
        super().apply(op)


class ObserveReturnsNone(ReferencePagedAdapter):
    def observe(self):  # type: ignore[no-untyped-def]
        return None


class FreeOffAfter50(ReferencePagedAdapter):
    """Honest for 50 ops, then its observation counts one free block too many (capacity_conservation)."""

    def reset(self, config):  # type: ignore[no-untyped-def]
        self.applied = 0
        super().reset(config)

    def apply(self, op):  # type: ignore[no-untyped-def]
        self.applied += 1
        return super().apply(op)

    def observe(self):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        obs = super().observe()
        return replace(obs, free=obs.free + 1) if self.applied > 50 else obs
