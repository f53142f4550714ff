"""Policy A/B: replay workloads through block-granularity adapters and measure eviction quality.

A replay drives one adapter through the adapter protocol only (reset, apply,
events, observe), so the same code measures the reference policies and vLLM.
Metrics, per (workload, policy, pool size):

- ``hit_tokens`` / ``prompt_tokens`` / ``hit_rate``: prompt tokens served from cache.
- ``evicted_blocks``: ``evict`` events (reclaims, i.e. dropped on purpose, are counted apart).
- ``rebuilt_from_eviction``: a block content that was evicted and later cached again.
- ``shared_anchor_eviction_ratio``: evictions of blocks that had been hit at least
  once in their cached life, over all evictions.
- ``regretful_evictions``: evictions of a content that a later prompt of the
  workload could have hit (it is one of that prompt's hit-eligible prefix blocks).
- ``refused_ops`` / ``forced_releases``: an admit or append the pool refused is
  retried after releasing the oldest other live request, one at a time
  (``forced_releases``); refused with nothing left to release, it is counted
  and its request skipped (``refused_ops``, ``skipped_ops``).

Contents are what KeyMemory in spec/invariants/key_memory.py calls them: the i-th block of
a request holds its first (i+1)*block_size tokens, so an implementation's opaque
key is mapped to content by the request table it first appears in.
"""

from __future__ import annotations

import bisect
import importlib
import importlib.util
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvspec.adapter import Adapter, Capabilities
from kvspec.adapters import AdapterLoadError, available, load
from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.reference.eviction_policies import EvictionPolicy, FamilyProtectPolicy, LRUPolicy
from kvspec.reference.paged import PagedPrefixCache
from kvspec.spec import Config, Event, Observation, Op, Outcome, Semantics

from .workloads import Workload

SCHEMA = 1
DEFAULT_FRACTIONS = (0.15, 0.25, 0.4, 0.6)
"""Pool sizes as fractions of a workload's footprint (the pool that never evicts)."""


class BenchError(RuntimeError):
    """The replay could not be run as asked (an adapter rejected a well-formed op, a bad pool size)."""


# -- block contents -----------------------------------------------------------------------


class PrefixIds:
    """Interns block contents: equal first-(i+1)-blocks prefixes get equal ids, without storing the prefixes."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}

    def chain(self, tokens: Sequence[int]) -> list[int]:
        """Content id of each full block of ``tokens``; block i stands for tokens[: (i+1)*block_size]."""
        bs, parent, out = self.block_size, -1, []
        for start in range(0, len(tokens) - bs + 1, bs):
            parent = self._ids.setdefault((parent, tuple(tokens[start : start + bs])), len(self._ids))
            out.append(parent)
        return out


class FutureDemand:
    """For each block content, the workload positions of the admits that could hit it.

    A prompt of n tokens can hit at most its first (n - 1) // block_size blocks
    (one token is always computed), so only those count as demand.
    """

    def __init__(self, workload: Workload, ids: PrefixIds) -> None:
        self._at: dict[int, list[int]] = {}
        bs = workload.block_size
        for pos, op in enumerate(workload.ops):
            if op.op == "admit":
                for content in ids.chain(op.tokens[: (len(op.tokens) - 1) // bs * bs]):
                    self._at.setdefault(content, []).append(pos)

    def wanted_after(self, content: int, pos: int) -> bool:
        """Some admit after workload position ``pos`` could hit ``content``."""
        at = self._at.get(content, [])
        return bisect.bisect_right(at, pos) < len(at)


# -- metrics ---------------------------------------------------------------------------------


@dataclass
class Metrics:
    admits: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    evicted_blocks: int = 0
    reclaimed_blocks: int = 0
    rebuilt_from_eviction: int = 0
    shared_anchor_evictions: int = 0
    regretful_evictions: int = 0
    refused_ops: int = 0
    forced_releases: int = 0
    skipped_ops: int = 0
    unknown_contents: int = 0  # evicted keys never seen in a request table (should stay 0)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def shared_anchor_eviction_ratio(self) -> float:
        return self.shared_anchor_evictions / self.evicted_blocks if self.evicted_blocks else 0.0

    @property
    def regretful_eviction_ratio(self) -> float:
        return self.regretful_evictions / self.evicted_blocks if self.evicted_blocks else 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        out["hit_rate"] = round(self.hit_rate, 6)
        out["shared_anchor_eviction_ratio"] = round(self.shared_anchor_eviction_ratio, 6)
        out["regretful_eviction_ratio"] = round(self.regretful_eviction_ratio, 6)
        return out


@dataclass
class _Life:
    """One cached life of a physical block: from being cached under a content to leaving the cache."""

    content: int | None
    hit: bool = False


class Tracker:
    """Turns one adapter's steps into Metrics.

    Keeps, after each step: ``memory`` (key -> content, learned from the request
    tables), ``cached`` (oid -> content of every block holding a key) and one
    ``_Life`` per cached block; ``pending`` counts evicted contents not cached again yet.
    """

    def __init__(self, block_size: int, ids: PrefixIds, demand: FutureDemand) -> None:
        self.block_size = block_size
        self.ids = ids
        self.demand = demand
        self.metrics = Metrics()
        self.memory: dict[Hashable, int] = {}
        self.cached: dict[Hashable, int | None] = {}
        self.lives: dict[Hashable, _Life] = {}
        self.pending: Counter[int] = Counter()

    def step(self, pos: int, op: Op, outcome: Outcome, events: Iterable[Event], obs: Observation) -> None:
        """Account for one applied op: its events first (they happened inside it), then the state after it."""
        m, bs = self.metrics, self.block_size
        evicted: set[Hashable] = set()
        for event in events:
            life = self.lives.pop(event.oid, None)
            if event.kind != "evict":
                m.reclaimed_blocks += 1
                continue
            m.evicted_blocks += 1
            evicted.add(event.oid)
            content = self.memory.get(event.key) if event.key is not None else None
            if content is None and life is not None:
                content = life.content
            if life is not None and life.hit:
                m.shared_anchor_evictions += 1
            if content is None:
                m.unknown_contents += 1
                continue
            self.pending[content] += 1
            if self.demand.wanted_after(content, pos):
                m.regretful_evictions += 1
        request = obs.requests.get(op.req or "") if outcome.status == "ok" else None
        if request is not None and op.op in ("admit", "append"):
            # Keys are cached only in the table of the request that filled the block.
            for oid, content in zip(request.objects, self.ids.chain(request.tokens), strict=False):
                key = obs.objects[oid].key if oid in obs.objects else None
                if key is not None:
                    self.memory.setdefault(key, content)
        after = {oid: self.memory.get(o.key) for oid, o in obs.objects.items() if o.key is not None}
        for oid, content in after.items():
            if oid in evicted or oid not in self.cached or self.cached[oid] != content:
                self.lives[oid] = _Life(content)
                if content is not None and self.pending[content] > 0:
                    self.pending[content] -= 1
                    m.rebuilt_from_eviction += 1
        for oid in self.cached.keys() - after.keys():
            self.lives.pop(oid, None)
        self.cached = after
        if request is not None and op.op == "admit":
            m.admits += 1
            m.prompt_tokens += len(op.tokens)
            m.hit_tokens += outcome.hit_tokens or 0
            for oid in request.objects[: (outcome.hit_tokens or 0) // bs]:
                if oid in self.lives:
                    self.lives[oid].hit = True


# -- replay ------------------------------------------------------------------------------------


@dataclass
class Run:
    """One replay: the metrics, and the hit tokens of each admit in workload order (None: refused)."""

    workload: str
    policy: str
    capacity: int
    fraction: float
    metrics: Metrics
    hits: list[int | None] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "policy": self.policy,
            "capacity": self.capacity,
            "pool_fraction": self.fraction,
            **self.metrics.to_json(),
        }


TrackerFactory = Callable[[int, PrefixIds, FutureDemand], Tracker]


def replay(
    workload: Workload,
    adapter: Adapter,
    capacity: int,
    *,
    fraction: float = 0.0,
    policy: str = "",
    tracker: TrackerFactory = Tracker,
) -> Run:
    """Replay ``workload`` on ``adapter`` with a fresh pool of ``capacity`` blocks, measuring as it goes."""
    bs = workload.block_size
    adapter.reset(Config(capacity=capacity, block_size=bs))
    adapter.events()
    ids = PrefixIds(bs)
    track = tracker(bs, ids, FutureDemand(workload, ids))
    m = track.metrics
    live: list[str] = []
    hits: list[int | None] = []
    started = time.perf_counter()

    def apply(pos: int, op: Op) -> Outcome:
        outcome = adapter.apply(op)
        if outcome.status == "invalid":
            raise BenchError(f"{policy or adapter.name} rejected {op} of {workload.name} as invalid: {outcome.message}")
        track.step(pos, op, outcome, adapter.events(), adapter.observe())
        return outcome

    for pos, op in enumerate(workload.ops):
        req = op.req or ""
        if op.op != "admit" and req not in live:
            m.skipped_ops += int(op.op != "release")
            continue
        outcome = apply(pos, op)
        while outcome.status == "refused" and any(r != req for r in live):
            victim = next(r for r in live if r != req)
            live.remove(victim)
            m.forced_releases += 1
            apply(pos, Op("release", victim))
            outcome = apply(pos, op)
        if op.op == "admit":
            hits.append(outcome.hit_tokens if outcome.status == "ok" else None)
        if outcome.status == "refused":
            m.refused_ops += 1
            if op.op == "append":  # the engine would abort it: drop the request
                live.remove(req)
                apply(pos, Op("release", req))
        elif op.op == "admit":
            live.append(req)
        elif op.op == "release":
            live.remove(req)
    return Run(workload.name, policy or adapter.name, capacity, fraction, m, hits, time.perf_counter() - started)


def pool_sizes(workload: Workload, fractions: Sequence[float]) -> list[tuple[float, int]]:
    """(fraction, capacity) per fraction of the footprint, never below the live peak; duplicates dropped."""
    peak, footprint = workload.peak_live_blocks(), workload.footprint()
    out: list[tuple[float, int]] = []
    for f in fractions:
        if f <= 0:
            raise BenchError(f"pool fraction must be positive, got {f}")
        capacity = max(peak, round(f * footprint))
        if capacity not in {c for _, c in out}:
            out.append((f, capacity))
    return out


def first_divergence(a: Sequence[int | None], b: Sequence[int | None]) -> int | None:
    """Index of the first admit whose hit tokens differ (None: the two lists are equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# -- controls: reference pools the built-in adapters do not offer -----------------------------------


def _variant(name: str, semantics: Semantics, policy: Callable[[], EvictionPolicy]) -> type[ReferencePagedAdapter]:
    def pool(config: Config) -> PagedPrefixCache:
        return PagedPrefixCache(
            config.capacity,
            config.block_size,
            hit_cap=semantics.hit_cap,
            policy=policy(),
            admission_anchor_blocks=semantics.admission_anchor_blocks,
            # vLLM >= 0.24 frees uncached blocks to the queue's head: they are taken first.
            uncached_first=semantics.eviction != "lru" or semantics.free_uncached == "head",
        )

    class Variant(ReferencePagedAdapter):
        def __init__(self) -> None:
            super().__init__(pool)

    Variant.name = name
    Variant.capabilities = Capabilities(semantics=semantics, version="0.1.0", notes=("a kvspec bench control",))
    Variant.__qualname__ = Variant.__name__ = f"Bench_{name.replace('-', '_')}"
    return Variant


CONTROLS: dict[str, type[ReferencePagedAdapter]] = {
    "reference-lru-uncached-first": _variant(
        "reference-lru-uncached-first", Semantics(eviction="lru", free_uncached="head"), LRUPolicy
    ),
    "reference-family-protect-nogate": _variant(
        "reference-family-protect-nogate",
        Semantics(eviction="family_protect", protect_min_hits=1),
        lambda: FamilyProtectPolicy(protect_min_hits=1),
    ),
}
"""Policies the A/B adds beside the built-in adapters, to tell apart effects a built-in one mixes:
lru with uncached blocks taken first (vLLM >= 0.24), and family_protect without its admission gate."""


def load_policy(name: str) -> Callable[[], Adapter]:
    """An adapter factory: a bench control by name, else whatever ``kvspec.adapters.load`` finds."""
    if name in CONTROLS:
        return CONTROLS[name]
    try:
        return load(name)
    except AdapterLoadError as exc:
        raise BenchError(str(exc)) from exc


def default_policies() -> list[str]:
    """Every available built-in adapter named reference* (the block-granularity policies), then the controls."""
    return [name for name in available() if name.startswith("reference")] + list(CONTROLS)


Progress = Callable[[str], None]


def run_ab(
    workloads: Sequence[Workload],
    policies: Sequence[str],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    vllm: bool = False,
    baselines: Sequence[str] = ("reference", "reference-lru-uncached-first"),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Each workload x policy x pool size; with ``vllm``, vLLM too, its hits compared per request with ``baselines``."""
    factories = {name: load_policy(name) for name in [*policies, *(["vllm"] if vllm else [])]}
    adapters = {name: factory() for name, factory in factories.items()}
    runs: list[Run] = []
    comparisons: list[dict[str, Any]] = []
    for workload in workloads:
        for fraction, capacity in pool_sizes(workload, fractions):
            by_policy: dict[str, Run] = {}
            for name, adapter in adapters.items():
                run = replay(workload, adapter, capacity, fraction=fraction, policy=name)
                by_policy[name] = run
                runs.append(run)
                if progress:
                    progress(f"{workload.name} pool={capacity} {name}: hit rate {run.metrics.hit_rate:.3f}")
            comparisons += [
                _compare(workload, name, by_policy[name], by_policy["vllm"])
                for name in baselines
                if vllm and name in by_policy
            ]
    for adapter in adapters.values():
        adapter.close()
    vllm_version = adapters["vllm"].capabilities.version if vllm else None
    return {
        "kvspec_policy_ab": SCHEMA,
        "config": {
            "policies": list(adapters),
            "pool_fractions": list(fractions),
            "baselines": list(baselines),
            "refusals": "an admit or append the pool refuses is retried after releasing the oldest other live "
            "request; with none left it is counted in refused_ops and its request skipped",
        },
        "workloads": [describe(w) for w in workloads],
        "runs": [run.to_json() for run in runs],
        "vllm": {"ran": vllm, "version": vllm_version, "comparisons": comparisons},
    }


def _compare(workload: Workload, baseline: str, ref: Run, other: Run) -> dict[str, Any]:
    i = first_divergence(ref.hits, other.hits)
    out: dict[str, Any] = {
        "workload": workload.name,
        "baseline": baseline,
        "capacity": ref.capacity,
        "pool_fraction": ref.fraction,
        "admits": len(ref.hits),
        "exact": i is None,
        "baseline_hit_tokens": ref.metrics.hit_tokens,
        "vllm_hit_tokens": other.metrics.hit_tokens,
        "baseline_evicted": ref.metrics.evicted_blocks,
        "vllm_evicted": other.metrics.evicted_blocks,
        "first_divergence": None,
    }
    if i is not None:
        reqs = [req for req, _ in workload.prompts()]
        out["first_divergence"] = {
            "admit_index": i,
            "req": reqs[i] if i < len(reqs) else None,
            "baseline_hit_tokens": ref.hits[i] if i < len(ref.hits) else None,
            "vllm_hit_tokens": other.hits[i] if i < len(other.hits) else None,
        }
    return out


def describe(workload: Workload) -> dict[str, Any]:
    prompts = workload.prompts()
    return {
        "name": workload.name,
        "seed": workload.seed,
        "block_size": workload.block_size,
        "params": workload.params,
        "ops": len(workload.ops),
        "admits": len(prompts),
        "prompt_tokens": sum(len(p) for _, p in prompts),
        "peak_live_blocks": workload.peak_live_blocks(),
        "distinct_full_blocks": workload.distinct_full_blocks(),
        "footprint": workload.footprint(),
    }


# -- presentation ---------------------------------------------------------------------------------

COLUMNS = (
    ("policy", "policy", "{}"),
    ("hit tok", "hit_tokens", "{}"),
    ("hit rate", "hit_rate", "{:.3f}"),
    ("evicted", "evicted_blocks", "{}"),
    ("rebuilt", "rebuilt_from_eviction", "{}"),
    ("anchor ratio", "shared_anchor_eviction_ratio", "{:.3f}"),
    ("regretful", "regretful_evictions", "{}"),
    ("refused", "refused_ops", "{}"),
)


CONTROL = "reference-lru-uncached-first"
"""What the summary compares against: the free queue order, uncached blocks first, as every other
reference policy takes them (and as vLLM does), so a difference is the policy's order alone."""


def summary(result: dict[str, Any], control: str = CONTROL, *, markdown: bool = False) -> list[str]:
    """Hit-rate change of each policy against ``control``, in points, per workload and pool size."""
    runs = {(r["workload"], r["capacity"], r["policy"]): r for r in result["runs"]}
    policies = [p for p in dict.fromkeys(r["policy"] for r in result["runs"]) if p != control]
    if not any(r["policy"] == control for r in result["runs"]):
        return []
    rows = []
    for w in result["workloads"]:
        for (name, capacity, policy), base in runs.items():
            if name != w["name"] or policy != control:
                continue
            cells = [f"{100 * (runs[name, capacity, p]['hit_rate'] - base['hit_rate']):+.1f}" for p in policies]
            rows.append([name, f"{capacity} ({base['pool_fraction']:.0%})", f"{base['hit_rate']:.3f}", *cells])
    title = f"hit rate against {control}, in points (+: the policy hits more)"
    head = ["workload", "pool", control, *policies]
    return [f"### {title}" if markdown else title, *([""] if markdown else []), *_grid(head, rows, markdown), ""]


def table(result: dict[str, Any], *, markdown: bool = False) -> str:
    """The runs as one table per workload, rows grouped by pool size, then the summary and the vLLM comparison."""
    header = ["pool", *(title for title, _, _ in COLUMNS)]
    lines: list[str] = []
    for w in result["workloads"]:
        rows = [
            [f"{r['capacity']} ({r['pool_fraction']:.0%})", *(fmt.format(r[key]) for _, key, fmt in COLUMNS)]
            for r in result["runs"]
            if r["workload"] == w["name"]
        ]
        title = f"{w['name']}: {w['admits']} requests, {w['prompt_tokens']} prompt tokens, footprint {w['footprint']}"
        lines.append(f"### {title}" if markdown else title)
        lines += [""] if markdown else []
        lines += _grid(header, rows, markdown)
        lines.append("")
    lines += summary(result, markdown=markdown)
    comparisons = result["vllm"]["comparisons"]
    if comparisons:
        title = f"does an lru reference predict vLLM's per-request hits exactly ({result['vllm']['version']})"
        lines.append(f"### {title}" if markdown else title)
        lines += [""] if markdown else []
        head = [
            "workload",
            "pool",
            "baseline",
            "exact",
            "hit tok (ref / vllm)",
            "evicted (ref / vllm)",
            "first divergence",
        ]
        rows = []
        for c in comparisons:
            d = c["first_divergence"]
            where = (
                "-"
                if d is None
                else f"admit {d['admit_index']} ({d['req']}): {d['baseline_hit_tokens']} vs {d['vllm_hit_tokens']}"
            )
            rows.append(
                [
                    c["workload"],
                    str(c["capacity"]),
                    c["baseline"],
                    "yes" if c["exact"] else "no",
                    f"{c['baseline_hit_tokens']} / {c['vllm_hit_tokens']}",
                    f"{c['baseline_evicted']} / {c['vllm_evicted']}",
                    where,
                ]
            )
        lines += _grid(head, rows, markdown)
    return "\n".join(lines).rstrip() + "\n"


def _grid(header: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        return [
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows),
        ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    return ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)).rstrip() for row in [header, *rows]]


def plot(result: dict[str, Any], path: str) -> str | None:
    """Hit rate and rebuilt blocks against pool size, one panel per workload. Returns why not, or None."""
    try:
        # Imported by name: matplotlib is optional, and not a dependency mypy needs to know.
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        return f"matplotlib is not importable ({exc}); no plot written"
    workloads = [w["name"] for w in result["workloads"]]
    policies = list(dict.fromkeys(r["policy"] for r in result["runs"]))
    cols = 3
    rows = -(-len(workloads) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, workloads, strict=False):
        for policy in policies:
            runs = [r for r in result["runs"] if r["workload"] == name and r["policy"] == policy]
            style = {"linestyle": "--", "marker": "x"} if policy == "vllm" else {"marker": "o"}  # vLLM overlays lru
            ax.plot([r["capacity"] for r in runs], [r["hit_rate"] for r in runs], label=policy, **style)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("pool (blocks)", fontsize=8)
        ax.set_ylabel("prefix hit rate", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(policies), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
