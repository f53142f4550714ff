"""The runners: the engines that explore an in-process adapter, the live-server runner, and the one dispatch.

``check_adapter(factory, name, Options(...))`` is the entry point; it hands the adapter to an engine
(``run_check``: Hypothesis, ``run_swarm``: the swarm explorer) or to the live runner by its capabilities.
Every engine steps through the ``Harness`` and reports through the findings pipeline (findings.py).
"""

from kvspec.case import Case

from .dispatch import check_adapter
from .findings import Result, minimize_ops, not_started, replay_ops
from .harness import AdapterHung, Harness, Tally, Violation
from .hypothesis_engine import run_check
from .machine import build_machine
from .options import PROFILES, LiveTarget, Options, Profile
from .swarm import run_swarm

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
    "minimize_ops",
    "not_started",
    "replay_ops",
    "run_check",
    "run_swarm",
]
