"""Memory: the spec's block keys grow linearly with a prompt, chained keys behave as the prefixes they stand
for, and a long check runs Hypothesis in rounds.

The bounds are correctness properties, not timings: keying each full block by its
whole token prefix makes one admit of 100k tokens (6,250 blocks of 16) hold 6,250
prefixes of 50k tokens on average: 2.4 GB in the ledger alone, 4.8 GB through the
harness (benchmarks/memory.py, docs/benchmarks.md). Chained keys hold each token once.
"""

from __future__ import annotations

import copy
import pickle
import random
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine

from kvspec.adapters import load
from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.spec import Config, Op, Semantics
from kvspec.spec.ledger import LedgerModel
from kvspec.spec.ops import blocks_for
from kvspec.stateful_tests import PROFILES, Harness, Options, Result, rounds, run_check

MB = 1 << 20
BOUND_MB = 300
LONG = 100_000
BLOCK_SIZE = 16


@pytest.fixture
def traced() -> Iterator[Callable[[], float]]:
    """Trace allocations for the test; the fixture's value reads the peak so far, in MB."""
    tracemalloc.start()
    try:
        yield lambda: tracemalloc.get_traced_memory()[1] / MB
    finally:
        tracemalloc.stop()


def _long_prompt() -> tuple[int, ...]:
    rng = random.Random(LONG)
    return tuple(rng.randrange(32_000) for _ in range(LONG))


def _pool() -> Config:
    return Config(capacity=blocks_for(LONG, BLOCK_SIZE) + 8, block_size=BLOCK_SIZE)


def test_a_100k_token_admit_and_release_through_the_ledger_stays_small(traced: Callable[[], float]) -> None:
    """Full-prefix keys took 2,388 MB here; chained keys take a few MB."""
    model = LedgerModel(_pool(), Semantics())
    prompt = _long_prompt()
    admitted = model.step(Op("admit", "r0", prompt))
    assert admitted.outcome.status == "ok" and len(model.index) == LONG // BLOCK_SIZE
    released = model.step(Op("release", "r0", keep=False))
    assert len(released.reclaimed) == LONG // BLOCK_SIZE
    assert traced() < BOUND_MB, f"peak {traced():.0f} MB"


def test_a_100k_token_admit_and_release_through_the_harness_stays_small(traced: Callable[[], float]) -> None:
    """The spec's prediction, every invariant and KeyMemory on the reference adapter: 4,779 MB before, now a few MB."""
    harness = Harness(ReferencePagedAdapter(), _pool())
    prompt = _long_prompt()
    assert harness.step(Op("admit", "r0", prompt)).status == "ok"
    assert harness.step(Op("admit", "r1", prompt)).hit_tokens == LONG - BLOCK_SIZE  # the hit cap leaves one block
    assert harness.step(Op("release", "r0")).status == "ok"
    assert harness.step(Op("release", "r1", keep=False)).status == "ok"
    assert len(harness.memory.content) == LONG // BLOCK_SIZE  # what each of the adapter's block hashes stands for
    assert traced() < BOUND_MB, f"peak {traced():.0f} MB"


def test_keys_of_equal_prefixes_are_one_object() -> None:
    """Two ledgers that cache the same prefix key it with the same object; the key equals its token tuple."""
    config = Config(capacity=8, block_size=2)
    first, second = LedgerModel(config, Semantics()), LedgerModel(config, Semantics())
    first.step(Op("admit", "a", (1, 2, 3, 4, 5)))
    second.step(Op("admit", "b", (1, 2, 3, 4, 6, 7)))
    keys_a = {tuple(k): k for k in first.observe().index or {}}
    keys_b = {tuple(k): k for k in second.observe().index or {}}
    assert set(keys_a) == {(1, 2), (1, 2, 3, 4)} and set(keys_b) == {(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 6, 7)}
    for prefix, key in keys_a.items():
        assert keys_b[prefix] is key
        assert key == prefix and prefix == key and hash(key) == hash(prefix)
    assert keys_b[(1, 2, 3, 4, 6, 7)] != (1, 2, 3, 4, 6) and keys_b[(1, 2, 3, 4, 6, 7)] != keys_a[(1, 2, 3, 4)]


def test_a_chained_key_knows_its_parent_and_depth() -> None:
    from kvspec.spec import BlockKey
    from kvspec.spec.block_key import block_keys

    keys = list(block_keys((5, 6, 7, 8, 9), 2))
    assert [tuple(k) for k in keys] == [(5, 6), (5, 6, 7, 8)]
    assert keys[1].parent is keys[0] and keys[0].parent is None
    assert (keys[1].tokens, keys[1].depth, len(keys[1])) == ((7, 8), 2, 4)
    assert BlockKey.chain(keys[0], [7, 8]) is keys[1]
    assert {(5, 6, 7, 8): "found"}[keys[1]] == "found" and keys[1] in {(5, 6, 7, 8)}
    with pytest.raises(TypeError):
        BlockKey()
    with pytest.raises(AttributeError):
        keys[0].tokens = (0, 0)  # type: ignore[misc]


def test_a_deep_chain_hashes_compares_prints_and_pickles_without_recursion() -> None:
    """10,000 blocks deep, under a recursion limit far below that: nothing walks the chain recursively."""
    from kvspec.spec import BlockKey
    from kvspec.spec.block_key import block_keys
    from kvspec.spec.policies import prefix_depth

    depth = 10_000
    prompt = tuple(range(depth * 3))
    leaf = list(block_keys(prompt, 3))[-1]
    assert isinstance(leaf, BlockKey)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        assert hash(leaf) == hash(prompt)
        assert leaf == prompt and prompt == leaf and leaf != prompt[:-1]
        assert repr(leaf) == repr(prompt)
        assert prefix_depth(leaf, 3) == depth and leaf.depth == depth
        assert pickle.loads(pickle.dumps(leaf)) is leaf
        assert copy.deepcopy(leaf) is leaf
        assert list(block_keys(prompt, 3))[-1] is leaf
        del leaf  # releasing the chain frees it block by block, without recursion
    finally:
        sys.setrecursionlimit(limit)


def test_a_deep_chain_through_the_ledger(traced: Callable[[], float]) -> None:
    """A 10,000-block request at block_size 1: admitted, hit, released and reclaimed, keys as prefixes.

    Full-prefix keys held 50M token slots here (over 400 MB); chained keys hold each token once."""
    depth = 10_000
    prompt = tuple(random.Random(1).randrange(4) for _ in range(depth))
    model = LedgerModel(Config(capacity=depth + 1, block_size=1), Semantics())
    assert model.step(Op("admit", "r0", prompt)).outcome.status == "ok"
    assert model.step(Op("admit", "r1", (*prompt, 9))).outcome.hit_tokens == depth
    model.step(Op("release", "r1"))
    step = model.step(Op("release", "r0", keep=False))
    assert len(step.reclaimed) == depth
    assert step.reclaimed[0] == prompt and repr(step.reclaimed[-1]) == repr(prompt[:1])
    assert traced() < 50, f"peak {traced():.0f} MB"


def test_a_long_run_goes_in_rounds_of_fresh_runners(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each round is its own Hypothesis run: the first as the run was, the later ones on seeds of their own."""
    calls: list[tuple[int | None, int]] = []
    run_one = rounds.run_state_machine_as_test

    def recording(factory: type[RuleBasedStateMachine], *, settings: Settings) -> None:
        calls.append((getattr(factory, "_hypothesis_internal_use_seed", None), settings.max_examples))
        run_one(factory, settings=settings)

    def check(max_examples: int, seed: int | None = None) -> Result:
        calls.clear()
        ci = PROFILES["ci"]
        return run_check(
            load("reference"),
            "reference",
            Options(profile=ci, seed=seed, max_examples=max_examples, cases_dir=tmp_path),
        )

    monkeypatch.setattr(rounds, "ROUND_EXAMPLES", 4)
    monkeypatch.setattr(rounds, "run_state_machine_as_test", recording)
    steps = []
    for _ in range(2):
        result = check(10)
        assert result.status == "passed", result.failure
        steps.append(result.tally.steps)
        assert [n for _, n in calls] == [4, 4, 2]
        assert calls[0][0] is None and len({s for s, _ in calls[1:]}) == 2  # derandomized first, then two seeds
    assert steps[0] == steps[1]  # a derandomized run in rounds is still reproducible
    assert result.derandomized and isinstance(result.seed, int)  # and its report names the seed it drew from
    replayed = check(10, seed=result.seed)  # --seed with it: the same run, later rounds included
    assert replayed.tally.steps == steps[0] and calls[0][0] is None
    check(6, seed=7)
    assert [s for s, _ in calls] == [7, rounds.round_seed(7, 1)]
