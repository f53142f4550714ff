"""The Hypothesis state machines and the conformance suite they form."""

from .conformance import PROFILES, Case, Profile, Result, replay_ops, run_check
from .harness import AdapterHung, Harness, Tally, Violation
from .machine import build_machine

__all__ = [
    "PROFILES",
    "AdapterHung",
    "Case",
    "Harness",
    "Profile",
    "Result",
    "Tally",
    "Violation",
    "build_machine",
    "replay_ops",
    "run_check",
]
