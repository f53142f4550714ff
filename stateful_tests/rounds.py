"""A long Hypothesis run in rounds, each its own runner, so that what Hypothesis keeps per example is bounded.

For the length of one run Hypothesis's runner keeps the result of every test case it
ran (up to 10,000 of them, each the whole choice sequence and its spans: about 85 KB
for one example of the suite) and a tree of every choice made. Over one run that grows
with the number of examples: ``kvspec check --adapter reference`` peaked at 73 MB of
RSS for 200 examples, 299 MB for 2,000 and 1,072 MB for 10,000 (benchmarks/memory.py).
Rounds of at most ``ROUND_EXAMPLES`` examples, each a fresh ``run_state_machine_as_test``,
bound it by the round instead of the run: 187 MB for 2,000, 198 MB for 10,000.

The first round is the run as it was (the same seed, or the same derandomized
sequence), so a run of ``ROUND_EXAMPLES`` or fewer is unchanged. Each later round
draws from its own seed, derived from the run's seed and the round's number, so a
derandomized or seeded run stays reproducible; an unseeded random run stays random.
A failure ends the run in the round that found it (shrunk there, as before).

``derandomized_seed`` is the seed a derandomized run draws from, so that its report
names a seed too, and ``--seed`` with it replays the run.
"""

from __future__ import annotations

import hashlib
import time

import hypothesis
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

ROUND_EXAMPLES = 1000
BUDGET_ROUND_EXAMPLES = 20  # under a time budget: the most a run can overrun it by


def derandomized_seed(machine: type[RuleBasedStateMachine]) -> int:
    """The seed of a derandomized run of ``machine``: what Hypothesis seeds its ``Random`` with under ``derandomize``.

    That is the digest of the test function Hypothesis wraps around the machine (its
    source, and the machine's own digest), so ``hypothesis.seed(derandomized_seed(m))(m)``
    draws exactly what ``m`` draws derandomized (tests/test_keep_going.py checks it on the
    installed Hypothesis version; a version that derandomizes otherwise fails there).
    """
    from hypothesis.internal.compat import int_from_bytes
    from hypothesis.internal.reflection import function_digest
    from hypothesis.stateful import get_state_machine_test

    test = get_state_machine_test(machine, settings=settings(derandomize=True, database=None))
    inner = test.hypothesis.inner_test  # type: ignore[attr-defined]  # set by @given
    return int(int_from_bytes(function_digest(inner)))


def round_seed(seed: int | None, number: int) -> int:
    """The seed of round ``number`` (> 0) of a run seeded with ``seed`` (None: derandomized)."""
    digest = hashlib.sha256(f"kvspec-round:{seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def run_in_rounds(
    machine: type[RuleBasedStateMachine], run: settings, seed: int | None, deadline: float | None = None
) -> None:
    """Run ``machine`` for ``run.max_examples`` examples in rounds of at most ``ROUND_EXAMPLES``.

    Keeps at most one round's Hypothesis runner alive at a time. ``seed``: the run's
    seed (None: derandomized, or random when ``run.derandomize`` is off). ``deadline``
    (``time.monotonic()``): no round starts after it, and rounds are of ``BUDGET_ROUND_EXAMPLES``,
    so a run overruns its budget by one short round at most. (Stopping inside a round is not
    possible: Hypothesis reads an example that ends early as inconsistent data generation.)
    """
    total = run.max_examples
    reseeded: type[RuleBasedStateMachine] | None = None  # hypothesis.seed marks the class it is given: not ours
    size = ROUND_EXAMPLES if deadline is None else BUDGET_ROUND_EXAMPLES
    for number, start in enumerate(range(0, max(total, 1), size)):
        if deadline is not None and time.monotonic() >= deadline:
            return
        factory = machine
        if number and (seed is not None or run.derandomize):
            reseeded = reseeded or type(machine.__name__, (machine,), {})
            factory = hypothesis.seed(round_seed(seed, number))(reseeded)
        run_state_machine_as_test(factory, settings=settings(run, max_examples=min(size, total - start)))
