"""Workload generators and the policy A/B: determinism, each scenario's claimed shape, metrics on a hand trace."""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.bench import GENERATORS, Workload, generate
from kvspec.bench.policy_ab import (
    CONTROLS,
    BenchError,
    FutureDemand,
    Metrics,
    PrefixIds,
    Tracker,
    default_policies,
    first_divergence,
    load_policy,
    plot,
    pool_sizes,
    replay,
    summary,
    table,
)
from kvspec.bench.workloads import CONVERSATION_MODES
from kvspec.cli import bench as bench_cli
from kvspec.cli import main as kvspec_main
from kvspec.spec import Event, Op, SpecError

SMALL = {"block_size": 4}


def _common_blocks(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _chains(w: Workload) -> list[tuple[str, list[int]]]:
    ids = PrefixIds(w.block_size)
    return [(req, ids.chain(prompt)) for req, prompt in w.prompts()]


# -- generators ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_workloads_are_deterministic_per_seed_and_differ_across_seeds(name: str) -> None:
    a, b, c = generate(name, 7, **SMALL), generate(name, 7, **SMALL), generate(name, 8, **SMALL)
    assert a.ops == b.ops and a.to_json() == b.to_json()
    assert a.ops != c.ops


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_workload_json_round_trip_and_schedule_shape(name: str, tmp_path: Path) -> None:
    w = generate(name, 3, **SMALL)
    path = tmp_path / f"{name}.json"
    w.save(path)
    data = json.loads(path.read_text())
    assert {"kvspec_workload", "name", "seed", "params", "block_size", "ops"} <= data.keys()
    assert data["kvspec_workload"] == 1 and data["params"]["block_size"] == 4
    assert Workload.load(path) == w
    # Every admitted request is released exactly once, and never more than `concurrency` are live.
    live: set[str] = set()
    peak = 0
    for op in w.ops:
        if op.op == "admit":
            assert op.req not in live
            live.add(op.req or "")
        elif op.op == "release":
            live.remove(op.req or "")
        else:
            assert op.op == "append" and op.req in live
        peak = max(peak, len(live))
    assert not live
    assert peak <= data["params"]["concurrency"]


def test_workload_rejects_unknown_names_and_schemas() -> None:
    with pytest.raises(SpecError):
        generate("no_such_workload", 0)
    with pytest.raises(SpecError):
        generate("long_conversation_continuous", 0, mode="sideways")
    with pytest.raises(SpecError):
        Workload.from_json({"kvspec_workload": 99, "name": "x", "seed": 0, "block_size": 4, "ops": []})


def test_ordinary_unique_cold_shares_no_full_block() -> None:
    w = generate("ordinary_unique_cold", 1, **SMALL)
    owners: dict[int, str] = {}
    for req, chain in _chains(w):
        for content in chain:
            assert owners.setdefault(content, req) == req, f"{req} shares a block with {owners[content]}"


@pytest.mark.parametrize("name", ["template_family_revisit", "template_family_revisit_cycles"])
def test_template_families_share_exactly_the_template_and_come_back_after_cold_traffic(name: str) -> None:
    w = generate(name, 2, **SMALL)
    n, cycles = w.params["template_blocks"], w.params["cycles"]
    chains = _chains(w)
    families: dict[int, list[int]] = {}  # first block -> positions of its requests
    for i, (_, chain) in enumerate(chains):
        families.setdefault(chain[0], []).append(i)
    members = {k: v for k, v in families.items() if len(v) > 1}
    assert len(members) == w.params["families"]
    for positions in members.values():
        assert len(positions) == w.params["burst"] * cycles
        first = chains[positions[0]][1]
        for p in positions[1:]:
            assert _common_blocks(first, chains[p][1]) == n  # the template, and not one block more
        # Revisited: between two bursts of a family come requests of no family (cold traffic).
        gaps = [b - a for a, b in itertools.pairwise(positions) if b - a > 1]
        between = {i for a, b in itertools.pairwise(positions) for i in range(a + 1, b)}
        assert len([g for g in gaps if g > w.params["cold_between"]]) >= cycles - 1
        assert any(len(families[chains[i][1][0]]) == 1 for i in between)


def test_ambiguous_hot_revisit_cold_prompts_repeat_once_and_hot_prefixes_come_back_last() -> None:
    w = generate("cache_pressure_ambiguous_hot_revisit", 4, **SMALL)
    p = w.params
    prompts = [prompt for _, prompt in w.prompts()]
    counts = Counter(prompts)
    repeated = [q for q, c in counts.items() if c == 2]
    assert len(repeated) == p["cold_pairs"]
    for q in repeated:  # the repeat follows at once: the cold block gets its one hit
        i = prompts.index(q)
        assert prompts[i + 1] == q
    hot_len = p["hot_blocks"] * p["block_size"]
    hot_uses = Counter(q[:hot_len] for q in prompts if counts[q] == 1)
    hot = [h for h, c in hot_uses.items() if c > 1]
    assert len(hot) == p["hot"]
    assert all(hot_uses[h] >= p["hot_uses"] + 1 for h in hot)
    assert {q[:hot_len] for q in prompts[-p["hot"] :]} == set(hot)


def _sessions(w: Workload) -> dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """session -> [(prompt, answer)] in turn order."""
    out: dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
    answer: dict[str, tuple[int, ...]] = {}
    for op in w.ops:
        if op.op == "append":
            answer[op.req or ""] = op.tokens
    for req, prompt in w.prompts():
        out.setdefault(req.split(".")[0], []).append((prompt, answer.get(req, ())))
    return out


@pytest.mark.parametrize("mode", CONVERSATION_MODES)
def test_conversations_extend_their_history_and_start_from_a_shared_persona(mode: str) -> None:
    w = generate(f"long_conversation_{mode}", 5, **SMALL)
    p = w.params
    persona_len = p["persona_blocks"] * p["block_size"]
    personas: set[tuple[int, ...]] = set()
    continued = restarted = 0
    for turns in _sessions(w).values():
        for (prev, ans), (prompt, _) in itertools.pairwise(turns):
            personas.add(prompt[:persona_len])
            if prompt[: len(prev) + len(ans)] == prev + ans:
                continued += 1
            else:
                restarted += 1
    assert len(_sessions(w)) == p["sessions"] * (3 if mode == "pressure" else 1)
    assert len(personas) <= p["personas"]  # every prompt opens with one of the shared persona prompts
    assert continued > restarted
    if mode in ("random_topic", "persona_rotation"):
        assert restarted > 0


def test_persona_rotation_moves_a_session_to_another_persona() -> None:
    w = generate("long_conversation_persona_rotation", 5, **SMALL)
    n = w.params["persona_blocks"] * w.params["block_size"]
    assert any(len({prompt[:n] for prompt, _ in turns}) > 1 for turns in _sessions(w).values())


def test_multi_turn_fork_branches_share_the_trunk_then_part() -> None:
    w = generate("long_conversation_multi_turn_fork", 6, **SMALL)
    p = w.params
    for turns in _sessions(w).values():
        trunk_prompt, trunk_answer = turns[p["turns"] // 2 - 1]
        trunk = trunk_prompt + trunk_answer
        heads = [prompt for prompt, _ in turns[p["turns"] // 2 :] if prompt[: len(trunk)] == trunk]
        firsts = {h[len(trunk) :] for h in heads}
        assert len(firsts) >= p["forks"]  # forks regenerate different continuations of one trunk


# -- metrics on a hand-checked trace -----------------------------------------------------------

HAND_OPS = (
    Op("admit", "A", (1, 2, 3, 4, 5)),
    Op("release", "A"),
    Op("admit", "B", (1, 2, 9, 9, 9)),
    Op("release", "B"),
    Op("admit", "C", (7, 7, 7, 7, 7, 7, 7)),
    Op("release", "C"),
    Op("admit", "D", (1, 2, 3, 4, 6)),
    Op("release", "D", keep=False),
)
"""Block size 2, pool of 4 blocks, the reference's LRU free queue (tail blocks of a request queue first).

A caches [1,2] and [1,2,3,4]. B hits [1,2] (2 tokens) and caches [1,2,9,9]. C needs all 4 blocks:
evicts [1,2,3,4], [1,2,9,9] and [1,2] (the one that was hit: a shared anchor). D hits nothing,
evicts C's [7]*6 and [7]*4, and caches [1,2] and [1,2,3,4] again (2 rebuilt). Of the 5
evictions, [1,2] and [1,2,3,4] are wanted by D later (2 regretful). D's release with keep=False
reclaims its 2 cached blocks: a reclaim, not an eviction.
"""

HAND = {
    "admits": 4,
    "prompt_tokens": 22,
    "hit_tokens": 2,
    "evicted_blocks": 5,
    "reclaimed_blocks": 2,
    "rebuilt_from_eviction": 2,
    "shared_anchor_evictions": 1,
    "regretful_evictions": 2,
    "refused_ops": 0,
    "forced_releases": 0,
    "unknown_contents": 0,
}


def _hand(tracker: type[Tracker] = Tracker) -> Metrics:
    return replay(Workload("hand", 0, {}, 2, HAND_OPS), ReferencePagedAdapter(), 4, tracker=tracker).metrics


def _mismatches(m: Metrics) -> list[str]:
    got = m.to_json()
    return sorted(k for k, v in HAND.items() if got[k] != v)


def test_metrics_of_the_hand_trace_are_the_hand_computed_numbers() -> None:
    m = _hand()
    assert _mismatches(m) == []
    assert m.hit_rate == pytest.approx(2 / 22)
    assert m.shared_anchor_eviction_ratio == pytest.approx(1 / 5)
    assert m.regretful_eviction_ratio == pytest.approx(2 / 5)


class _ReclaimCountedAsEvict(Tracker):
    def step(self, pos: int, op: Op, outcome: Any, events: Any, obs: Any) -> None:
        super().step(pos, op, outcome, [Event("evict", e.oid, e.key) for e in events], obs)


class _RebuiltWithoutEviction(Tracker):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.pending = _AlwaysPending()


class _AlwaysPending(Counter[int]):
    def __getitem__(self, key: int) -> int:
        return 1


class _RegretEveryEviction(Tracker):
    def __init__(self, block_size: int, ids: PrefixIds, demand: FutureDemand) -> None:
        super().__init__(block_size, ids, demand)
        self.demand.wanted_after = lambda content, pos: True  # type: ignore[method-assign]


class _HitNeverRecorded(Tracker):
    def step(self, pos: int, op: Op, outcome: Any, events: Any, obs: Any) -> None:
        super().step(pos, op, outcome, events, obs)
        for life in self.lives.values():
            life.hit = False


@pytest.mark.parametrize(
    ("broken", "caught"),
    [
        (_ReclaimCountedAsEvict, "evicted_blocks"),
        (_RebuiltWithoutEviction, "rebuilt_from_eviction"),
        (_RegretEveryEviction, "regretful_evictions"),
        (_HitNeverRecorded, "shared_anchor_evictions"),
    ],
)
def test_a_seeded_broken_metric_is_caught_by_the_hand_trace(broken: type[Tracker], caught: str) -> None:
    assert caught in _mismatches(_hand(broken))


def test_unique_cold_traffic_gives_no_hits_and_no_regret() -> None:
    w = generate("ordinary_unique_cold", 0, **SMALL)
    for fraction, capacity in pool_sizes(w, [0.1, 0.5]):
        m = replay(w, ReferencePagedAdapter(), capacity, fraction=fraction).metrics
        assert m.hit_tokens == 0 and m.regretful_evictions == 0 and m.rebuilt_from_eviction == 0
        assert m.evicted_blocks > 0 and m.refused_ops == 0


def test_a_pool_below_the_live_peak_forces_releases_and_counts_them() -> None:
    ops = (
        Op("admit", "a", tuple(range(1, 9))),
        Op("admit", "b", tuple(range(11, 19))),
        Op("append", "a", (5, 5)),
        Op("append", "b", (6,)),
        Op("release", "a"),
        Op("release", "b"),
    )
    w = Workload("tight", 0, {}, 4, ops)
    assert w.peak_live_blocks() == 6
    run = replay(w, ReferencePagedAdapter(), 4)
    # a's append does not fit beside b: b is released for it, so b's append is skipped (its release too).
    assert run.metrics.forced_releases == 1 and run.metrics.skipped_ops == 1
    assert run.hits == [0, 0]
    with pytest.raises(BenchError):  # a prompt larger than the whole pool is bad input, not a refusal
        replay(w, ReferencePagedAdapter(), 1)


def test_pool_sizes_are_floored_at_the_live_peak_and_deduplicated() -> None:
    w = generate("long_conversation_continuous", 0, **SMALL)
    sizes = pool_sizes(w, [0.01, 0.02, 1.0])
    assert sizes[0][1] == w.peak_live_blocks() and len(sizes) == 2
    assert sizes[-1][1] == w.footprint()
    run = replay(w, ReferencePagedAdapter(), w.footprint())
    assert run.metrics.evicted_blocks == 0  # the footprint is a pool that never evicts


def test_first_divergence() -> None:
    assert first_divergence([0, 4, 8], [0, 4, 8]) is None
    assert first_divergence([0, 4, 8], [0, 8, 8]) == 1
    assert first_divergence([0, 4], [0, 4, None]) == 2


# -- the command line --------------------------------------------------------------------------


def test_cli_writes_workload_files_and_ab_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "w"
    only = ["--only", "template_family_revisit", "--only", "ordinary_unique_cold", "--block-size", "4"]
    assert kvspec_main(["bench", "workloads", "--out", str(folder), *only]) == 0
    files = sorted(p.name for p in folder.glob("*.json"))
    assert files == ["ordinary_unique_cold.json", "template_family_revisit.json"]
    assert Workload.load(folder / files[1]).name == "template_family_revisit"

    out = tmp_path / "ab.json"
    args = ["policies", "--workloads", str(folder), "--policies", "reference", "--pool-fractions", "0.2,0.5"]
    assert kvspec_main(["bench", *args, "--vllm", "off", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kvspec_policy_ab"] == 1 and result["vllm"]["ran"] is False
    assert result["command"].startswith("kvspec bench policies --workloads")
    assert {w["name"] for w in result["workloads"]} == {"template_family_revisit", "ordinary_unique_cold"}
    assert len(result["runs"]) == 4
    for run in result["runs"]:
        assert run["policy"] == "reference" and 0.0 <= run["hit_rate"] <= 1.0
        assert {"evicted_blocks", "rebuilt_from_eviction", "shared_anchor_eviction_ratio", "regretful_evictions"} <= (
            run.keys()
        )
    printed = capsys.readouterr().out
    assert "template_family_revisit" in printed and "vLLM comparison skipped" in printed


def test_cli_could_not_run_exits_2(tmp_path: Path) -> None:
    assert (
        kvspec_main(["bench", "policies", "--only", "ordinary_unique_cold", "--policies", "nope", "--vllm", "off"]) == 2
    )
    assert kvspec_main(["bench", "policies", "--workloads", str(tmp_path), "--vllm", "off"]) == 2


def test_register_adds_bench_and_takes_more_subcommands(monkeypatch: pytest.MonkeyPatch) -> None:
    def register_extra(bench_sub: Any) -> None:
        bench_sub.add_parser("extra").set_defaults(handler=lambda args: 0)

    names = [add.__name__ for add in bench_cli.SUBCOMMANDS]
    assert names == ["register_workloads", "register_policies", "register_live"]
    monkeypatch.setattr(bench_cli, "SUBCOMMANDS", [*bench_cli.SUBCOMMANDS, register_extra])
    parser = argparse.ArgumentParser(prog="kvspec")
    bench_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "policies", "--vllm", "off", "--pool-fractions", "0.3"])
    assert args.handler is bench_cli.cmd_policies and args.pool_fractions == [0.3]
    assert parser.parse_args(["bench", "extra"]).handler(None) == 0
    assert parser.parse_args(["bench", "live", "--from-json", "x.json"]).bench_command == "live"


def test_plot_says_why_not_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    reason = plot({"workloads": [], "runs": []}, str(tmp_path / "x.png"))
    assert reason is not None and "matplotlib" in reason
    assert not (tmp_path / "x.png").exists()


# -- controls and vLLM ---------------------------------------------------------------------------

UNCACHED_FIRST_OPS = (
    Op("admit", "a", (1, 2, 3, 4)),  # [1,2] and [1,2,3,4] cached
    Op("admit", "b", (5, 6, 7)),  # [5,6] cached, [7] an uncached tail
    Op("release", "a"),
    Op("release", "b"),  # queue: a's [1,2,3,4], a's [1,2], b's tail (uncached), b's [5,6]
    Op("admit", "c", (8, 8)),
    Op("admit", "d", (1, 2, 3, 4, 9)),
)
"""Pool of 4 blocks, block size 2. c needs one block: the lru pops the queue head, evicting
[1,2,3,4], so d hits 2 tokens and evicts [5,6] too; taking uncached blocks first, c gets b's
tail, d hits 4 tokens and only [5,6] is evicted."""


def test_the_uncached_first_control_differs_from_lru_only_where_an_uncached_block_is_free() -> None:
    w = Workload("uncached", 0, {}, 2, UNCACHED_FIRST_OPS)
    lru = replay(w, load_policy("reference")(), 4)
    head = replay(w, load_policy("reference-lru-uncached-first")(), 4)
    assert lru.hits == [0, 0, 0, 2] and lru.metrics.evicted_blocks == 2
    assert head.hits == [0, 0, 0, 4] and head.metrics.evicted_blocks == 1
    assert CONTROLS["reference-lru-uncached-first"].capabilities.semantics.free_uncached == "head"


def test_controls_are_default_policies_and_unknown_names_are_bench_errors() -> None:
    assert set(CONTROLS) <= set(default_policies()) and "reference" in default_policies()
    nogate = CONTROLS["reference-family-protect-nogate"].capabilities.semantics
    assert nogate.eviction == "family_protect" and nogate.admission_anchor_blocks is None
    with pytest.raises(BenchError):
        load_policy("no-such-policy")


def test_lru_with_uncached_first_predicts_vllm_hits_exactly() -> None:
    pytest.importorskip("vllm", reason="the vLLM comparison needs the vllm extra")
    w = generate("long_conversation_pressure", 0, **SMALL)
    vllm = load_policy("vllm")()
    for _, capacity in pool_sizes(w, [0.25]):
        head = replay(w, load_policy("reference-lru-uncached-first")(), capacity)
        engine = replay(w, vllm, capacity)
        assert head.metrics.admits == engine.metrics.admits
        assert first_divergence(head.hits, engine.hits) is None


def test_summary_gives_hit_rate_points_against_the_control() -> None:
    def run(policy: str, hit_rate: float) -> dict[str, Any]:
        metrics = Metrics(admits=1, prompt_tokens=1000, hit_tokens=round(1000 * hit_rate)).to_json()
        return {"workload": "w", "policy": policy, "capacity": 10, "pool_fraction": 0.25, **metrics}

    result = {
        "workloads": [{"name": "w", "admits": 1, "prompt_tokens": 1000, "footprint": 40}],
        "runs": [run("reference-lru-uncached-first", 0.5), run("reference-shared-aware", 0.62), run("other", 0.41)],
        "vllm": {"comparisons": []},
    }
    rows = summary(result)
    assert rows[1].split() == ["workload", "pool", "reference-lru-uncached-first", "reference-shared-aware", "other"]
    assert rows[2].split() == ["w", "10", "(25%)", "0.500", "+12.0", "-9.0"]
    assert "+12.0" in table(result)
    assert summary({**result, "runs": result["runs"][1:]}) == []  # no control run, no summary


def test_vllm_that_cannot_start_is_skipped_on_auto_and_fails_on_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(name: str) -> Any:
        raise BenchError("no KV cache manager here")

    monkeypatch.setattr(bench_cli, "vllm_installed", lambda: True)
    monkeypatch.setattr(bench_cli, "load_policy", broken)
    args = ["policies", "--only", "ordinary_unique_cold", "--policies", "reference", "--pool-fractions", "0.5"]
    assert kvspec_main(["bench", *args, "--vllm", "auto"]) == 0
    assert "vLLM comparison skipped: the vllm adapter does not start: no KV cache manager" in capsys.readouterr().out
    assert kvspec_main(["bench", *args, "--vllm", "on"]) == 2
    monkeypatch.setattr(bench_cli, "vllm_installed", lambda: False)
    assert kvspec_main(["bench", *args, "--vllm", "on"]) == 2
