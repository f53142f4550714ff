"""The conformance suite: the Hypothesis state machine, the live-server runner, and the one dispatch to them.

``check_adapter(factory, name, Options(...))`` is the entry point; ``run_check`` and
``run_live`` are the two runners it chooses between by the adapter's capabilities.
"""

from kvspec.case import Case

from .conformance import PROFILES, Profile, Result, replay_ops, run_check
from .dispatch import LiveTarget, Options, check_adapter
from .harness import AdapterHung, Harness, Tally, Violation
from .machine import build_machine

__all__ = [
    "PROFILES",
    "AdapterHung",
    "Case",
    "Harness",
    "LiveTarget",
    "Options",
    "Profile",
    "Result",
    "Tally",
    "Violation",
    "build_machine",
    "check_adapter",
    "replay_ops",
    "run_check",
]
