"""Counterexamples kept in the Hypothesis example database under the kit's own key, replayed first by the next run.

Hypothesis keeps a failing example as the choice sequence that drew it, under a key of
the test function's digest; only a run of that very machine can produce one. A failure
found without Hypothesis (the swarm explorer, stateful_tests/swarm.py) has concrete ops
and no choices, so it is kept in the same database (any ``ExampleDatabase``: a folder,
or one shared through Redis) under :data:`CASES_KEY`, as the case JSON of
``kvspec.case.Case``. The Hypothesis engine (``hypothesis_engine.run_check``) reads them before
it draws anything and replays each as a given case; one that no longer fails (the bug
was fixed) is deleted, as Hypothesis deletes its own examples that pass.
"""

from __future__ import annotations

from hypothesis.database import ExampleDatabase

from kvspec import jsonio
from kvspec.case import Case

CASES_KEY = b"kvspec-cases"
"""The database key the kit's own counterexamples are kept under (Hypothesis's keys are digests, never this)."""


def _value(case: Case) -> bytes:
    return jsonio.dumps(case.to_json(), indent=None).encode()


def keep_case(db: ExampleDatabase, case: Case) -> None:
    """Keep ``case`` in ``db`` (saving the same case twice keeps it once: the database holds a set per key)."""
    db.save(CASES_KEY, _value(case))


def kept_cases(db: ExampleDatabase) -> list[Case]:
    """The cases kept in ``db``, in a stable order (by their JSON); a value that is no valid case is deleted."""
    cases = []
    for value in sorted(db.fetch(CASES_KEY)):
        try:
            cases.append(Case.from_json(jsonio.loads(value)))
        except ValueError:
            db.delete(CASES_KEY, value)
    return cases


def forget_case(db: ExampleDatabase, case: Case) -> None:
    """Delete ``case`` from ``db`` (it no longer fails)."""
    db.delete(CASES_KEY, _value(case))


__all__ = ["CASES_KEY", "forget_case", "keep_case", "kept_cases"]
