"""spec/delta.py's Overlay: membership answers exactly as a lookup does (the state before the step).

``key in overlay`` is the checks' hot lookup; it is computed without going through ``overlay[key]``,
so these tests hold it to ``overlay[key]`` not raising, for every kind of key a step leaves.
"""

from __future__ import annotations

from typing import Any

from kvspec.spec.delta import _ABSENT, Overlay


def looks_up(overlay: Overlay, key: Any) -> bool:
    try:
        overlay[key]
    except (KeyError, TypeError):
        return False
    return True


def test_membership_is_a_lookup_that_does_not_raise() -> None:
    # After a step: 1 kept, 2 changed (was "b0"), 3 added (absent before), 4 dropped (was "d0"), 5 never held.
    now = {1: "a", 2: "b", 3: "c"}
    overlay = Overlay(now, {2: "b0", 3: _ABSENT, 4: "d0"})
    for key in (1, 2, 3, 4, 5, [6], "x"):
        assert (key in overlay) is looks_up(overlay, key), key
    assert [k for k in (1, 2, 3, 4, 5) if k in overlay] == [1, 2, 4]
    assert dict(overlay.items()) == {1: "a", 2: "b0", 4: "d0"}


def test_iteration_over_given_keys_keeps_those_held_before() -> None:
    overlay = Overlay({1: "a", 3: "c"}, {3: _ABSENT, 4: "d0"}, keys=[1, 3, 4, 5])
    assert list(overlay) == [1, 4] and len(overlay) == 2
    assert Overlay({1: "a"}, keys=[1, 2]).keys() == {1}
