"""Live conformance: drive a running server and judge what it published with the spec's stream checks.

The runner is typed to the :class:`~kvspec.adapter.LiveAdapter` protocol, so any server with an adapter
that implements it is driven the same way (the kit's own: :mod:`kvspec.adapters.vllm_live`). Two modes,
each a driver that the adapter records:

- exact: sequential completions built to share prefixes - cold prompts, a family member that keeps
  some whole blocks of an earlier prompt, a fork at an unaligned token, an exact repeat, a
  continuation of an earlier prompt and its output, and cache resets. Each request is sent after
  the previous one's response, so the spec predicts its ``cached_tokens`` exactly from the blocks
  cached at its admission (``predicted_cached_tokens``);
- load: concurrent bursts - one that shares a prefix, one sized to exhaust the pool and force
  preemptions - judged against bounds (``cached_tokens_within_bounds``), with
  ``vllm:num_preemptions_total`` read before and after.

The driver is a seeded random one, not a Hypothesis state machine: a live server's step timing
(and so its event batching) is not reproducible, so replay-based shrinking would chase a moving
target; the counterexample is instead the recorded log, which :func:`check_recorded` re-checks
offline, deterministically. Exit codes and the report follow ``kvspec check``'s contract.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.adapter import LiveAdapter, ServerInfo, ServerStartError
from kvspec.report import ExitCode, Report, Row, Status, now, rows
from kvspec.spec.stream import STREAM_INVARIANTS, StreamResult

MODES = ("exact", "load", "both")
FIRST_TOKEN = 3  # 0-2 are the tokenizer's unk, bos, eos


@dataclass(frozen=True)
class Burst:
    """Concurrent requests: ``shared`` leading tokens common to all prompts (0: all distinct)."""

    name: str
    requests: int
    prompt_tokens: int
    max_tokens: int
    shared: int = 0


@dataclass(frozen=True)
class LiveProfile:
    name: str
    exact_requests: int
    bursts: tuple[Burst, ...]
    max_new_tokens: int = 40


# On the tiny CPU server (63 usable blocks of 32 tokens, 8 sequences), "pressure" preempts.
LIVE_PROFILES: dict[str, LiveProfile] = {
    "ci": LiveProfile(
        "ci",
        exact_requests=80,
        bursts=(Burst("shared-prefix", 6, 160, 24, shared=96), Burst("pressure", 8, 200, 250)),
    ),
    "thorough": LiveProfile(
        "thorough",
        exact_requests=500,
        bursts=(
            Burst("shared-prefix", 8, 200, 32, shared=128),
            Burst("pressure", 8, 200, 250),
            Burst("shared-pressure", 8, 224, 250, shared=96),
            Burst("pressure-long", 8, 256, 250),
        ),
    ),
}


@dataclass
class LiveResult:
    """A live check's outcome, with the report contract of ``kvspec check`` (exit codes 0, 1, 2)."""

    adapter: str
    profile: str
    seed: int
    mode: str
    started_at: str
    adapter_version: str = ""
    duration_s: float = 0.0
    status: Status = "passed"
    error: str = ""
    stream: StreamResult | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    coverage: Counter[str] = field(default_factory=Counter)
    live: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.of(self.status)

    def report(self) -> Report:
        """The run as the kit's report: one row per stream invariant, and a ``live`` section."""
        seen = self.stream.seen if self.stream else Counter()
        return Report(
            adapter=self.adapter,
            rows=stream_rows(self.stream),
            adapter_version=self.adapter_version,
            profile=self.profile,
            seed=self.seed,
            started_at=self.started_at,
            duration_s=self.duration_s,
            examples=seen.get("requests", 0),
            steps=seen.get("events", 0),
            status=self.status,
            error=self.error,
            coverage=self.coverage,
            findings=self.findings,
            cases=self.cases,
            sections={"live": {"mode": self.mode, **self.live, "seen": dict(sorted(seen.items()))}},
            title=f"kvspec check: adapter {self.adapter} {self.adapter_version}, profile {self.profile}, "
            f"mode {self.mode}, seed {self.seed}",
            details=self._details(),
        )

    def _details(self) -> list[str]:
        """What the table says below the verdicts: traffic, coverage, findings, the saved log."""
        live, lines = self.live, []
        if self.stream is not None:
            seen = self.stream.seen
            lines += [
                "",
                f"{seen.get('requests', 0)} requests, {seen.get('batches', 0)} event batches, "
                f"{seen.get('events', 0)} events ({seen.get('stored', 0)} blocks stored, {seen.get('removed', 0)} "
                f"removed) in {self.duration_s:.1f} s"
                + (f"; server startup {live['startup_s']} s" if live.get("startup_s") is not None else "")
                + f"; {live.get('requests_per_s')} requests/s checked, {live.get('preemptions', 0)} preemptions",
            ]
        if self.coverage:
            lines.append("exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(self.coverage.items())))
        for finding in self.findings[:10]:
            lines.append(f"finding: {json.dumps(finding)[:300]}")
        for case in self.cases:
            lines.append(f"recorded log saved: {case}  (re-check offline: check_recorded)")
        return lines


def stream_rows(stream: StreamResult | None) -> list[Row]:
    """One row per stream invariant (all unknown before the stream was checked)."""
    if stream is None:
        return rows(STREAM_INVARIANTS, {}, {})
    return rows(STREAM_INVARIANTS, stream.checked, stream.first_violation)


# -- exact mode -------------------------------------------------------------------------


class ExactDriver:
    """Sequential prompts that share prefixes with earlier ones in every way the block cache distinguishes."""

    OPS = ("cold", "family", "fork", "repeat", "continue", "reset")

    def __init__(self, adapter: LiveAdapter, server: ServerInfo, rng: random.Random, max_new: int) -> None:
        self.adapter, self.server, self.rng, self.max_new = adapter, server, rng, max_new
        self.history: list[tuple[list[int], list[int]]] = []  # (prompt, output)
        self.coverage: Counter[str] = Counter()

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(FIRST_TOKEN, self.server.vocab_size) for _ in range(n)]

    def _length(self, most: int) -> int:
        """A prompt length up to ``most``: often a whole number of blocks (where the hit cap bites)."""
        bs = self.server.block_size
        if most >= bs and self.rng.random() < 0.4:
            return bs * self.rng.randint(1, most // bs)
        return self.rng.randint(1, most)

    def _prompt(self, op: str, budget: int) -> list[int]:
        bs, rng = self.server.block_size, self.rng
        if op == "cold" or not self.history:
            return self._tokens(self._length(budget))
        prompt, output = rng.choice(self.history)
        if op == "repeat":
            return prompt[:budget]
        if op == "continue":
            base = (prompt + output)[:budget]
            return base + self._tokens(rng.randint(0, budget - len(base)))
        if op == "family":
            keep = bs * rng.randint(0, min(len(prompt), budget) // bs)
        else:  # fork: at an unaligned token
            keep = rng.randint(1, max(1, min(len(prompt), budget) - 1))
        return prompt[:keep] + self._tokens(max(1, self._length(budget - keep)) if budget > keep else 0)

    def step(self) -> None:
        op = self.rng.choices(self.OPS, weights=(3, 3, 2, 2, 2, 1 if self.server.can_reset else 0))[0]
        self.coverage[f"exact {op}"] += 1
        if op == "reset":
            self.adapter.reset_cache()
            return
        max_tokens = self.rng.randint(1, self.max_new)
        prompt = self._prompt(op, self.server.max_model_len - max_tokens)
        record = self.adapter.complete(prompt, max_tokens, mode="exact")
        self.history.append((prompt, list(record.get("output_token_ids") or [])))
        if record.get("cached_tokens"):
            self.coverage["exact hits"] += 1


def run_exact(adapter: LiveAdapter, server: ServerInfo, profile: LiveProfile, rng: random.Random) -> Counter[str]:
    """Send ``profile.exact_requests`` sequential requests; read the gauges (idle) every ten."""
    driver = ExactDriver(adapter, server, rng, profile.max_new_tokens)
    for i in range(profile.exact_requests):
        driver.step()
        if i % 10 == 9:
            adapter.snapshot(idle=True)
    return driver.coverage


# -- load mode ------------------------------------------------------------------------------


def run_load(adapter: LiveAdapter, server: ServerInfo, profile: LiveProfile, rng: random.Random) -> Counter[str]:
    """Each burst at once, gauges read (idle) before and after; preemptions counted from the counter."""
    coverage: Counter[str] = Counter()
    vocab, longest = server.vocab_size, server.max_model_len
    for burst in profile.bursts:
        prompt_tokens = min(burst.prompt_tokens, longest - burst.max_tokens)
        common = [rng.randrange(FIRST_TOKEN, vocab) for _ in range(min(burst.shared, prompt_tokens - 1))]
        prompts = [
            common + [rng.randrange(FIRST_TOKEN, vocab) for _ in range(prompt_tokens - len(common))]
            for _ in range(burst.requests)
        ]
        adapter.settle()
        before = adapter.preemptions_total() or 0.0
        records = adapter.complete_many(prompts, burst.max_tokens)
        adapter.settle()
        after = adapter.preemptions_total() or 0.0
        coverage[f"load {burst.name} requests"] += len(records)
        coverage[f"load {burst.name} preemptions"] += int(after - before)
        coverage["load hits"] += sum(1 for r in records if r.get("cached_tokens"))
    return coverage


# -- the run ------------------------------------------------------------------------------------


def run_live(
    adapter: LiveAdapter,
    *,
    profile: LiveProfile,
    seed: int | None = None,
    mode: str = "both",
    cases_dir: Path = Path(".kvspec/cases"),
    progress: Callable[[str], None] | None = None,
) -> LiveResult:
    """Start ``adapter``, drive it in ``mode``, check the recorded stream, and always close the adapter.

    A violation saves the recorded log under ``cases_dir`` (re-checkable offline with ``check_recorded``).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    seed = 0 if seed is None else seed
    result = LiveResult(adapter.name, profile.name, seed, mode, now())
    t0 = time.perf_counter()
    say = progress or (lambda line: None)
    try:
        server = adapter.start()
        result.adapter_version = server.version
        result.live["startup_s"] = adapter.startup_s
        result.live["pool"] = {"block_size": server.block_size, "num_gpu_blocks": server.num_gpu_blocks}
        say(f"server ready at {adapter.url} (startup {adapter.startup_s} s), block size {server.block_size}")
        if not server.has_events:
            result.findings.append({"kind": "unobservable", "message": "no --events endpoint: stream checks unknown"})
        rng = random.Random(seed)
        driven = time.perf_counter()
        if mode in ("exact", "both"):
            t = time.perf_counter()
            result.coverage += run_exact(adapter, server, profile, rng)
            result.live["exact_s"] = round(time.perf_counter() - t, 2)
            result.live["exact_requests_per_s"] = round(profile.exact_requests / result.live["exact_s"], 1)
            say(f"exact mode: {profile.exact_requests} sequential requests in {result.live['exact_s']} s")
        if mode in ("load", "both"):
            t = time.perf_counter()
            result.coverage += run_load(adapter, server, profile, rng)
            result.live["load_s"] = round(time.perf_counter() - t, 2)
            say(f"load mode: {len(profile.bursts)} bursts in {result.live['load_s']} s")
        adapter.settle()
        adapter.snapshot(idle=True)
        drive_s = time.perf_counter() - driven
        result.stream = adapter.check()
        seen = result.stream.seen
        result.live.update(
            {
                "drive_s": round(drive_s, 2),
                "requests": seen.get("requests", 0),
                "requests_per_s": round(seen.get("requests", 0) / drive_s, 1) if drive_s else None,
                "preemptions": sum(v for k, v in result.coverage.items() if k.endswith("preemptions")),
                "event_gaps": adapter.gaps,
            }
        )
        if not result.stream.held:
            result.status = "violated"
            result.findings += result.stream.violations[:10]
            violated = result.stream.violated[0]
            result.cases.append(str(save_log(adapter.records(), cases_dir, violated, adapter.name)))
    except ServerStartError as exc:
        result.status, result.error = "error", f"the server did not come up: {exc}"
    except KeyboardInterrupt:
        result.status, result.error = "interrupted", "interrupted"
    except Exception as exc:  # the server misbehaved below the level of a verdict: the check could not run
        result.status, result.error = "error", f"{type(exc).__name__}: {exc}"
    finally:
        adapter.close()
        result.duration_s = time.perf_counter() - t0
    return result


def save_log(records: list[dict[str, Any]], directory: Path, invariant: str, name: str = "vllm-live") -> Path:
    """Write a recorded log as a case file (JSON lines), named by the adapter, the broken invariant and a digest."""
    directory.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    path = directory / f"{name}-{invariant}-{hashlib.sha256(text.encode()).hexdigest()[:10]}.jsonl"
    path.write_text(text)
    return path
