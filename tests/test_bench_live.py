"""`kvspec bench live`: the load generator and its statistics against a fake vLLM server, the JSON schema,
and (with vLLM installed) a small A/B on the real tiny server.

The fake speaks the part of vLLM's OpenAI API the benchmark uses: /v1/models, /metrics (Prometheus text
with the prefix-cache counters) and a streamed /v1/completions (SSE over chunked HTTP/1.1, a final usage
chunk with ``prompt_tokens_details.cached_tokens``, ``data: [DONE]``). It keeps a block-level prefix cache
so a shared prefix really hits, and injects known delays: the first token comes ``base_ttft +
per_uncached * uncached_tokens`` after the headers, then one token every ``itl`` seconds. Chosen
requests (by arrival order) fail with HTTP 500, a streamed error object, or a stream cut before [DONE].
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvspec.adapters.vllm_live.client import RequestResult, stream_completion
from kvspec.bench.live.benchmark import LiveOptions, configuration, run_benchmark
from kvspec.bench.live.driver import COUNTERS, ServerDidNotStart, run_ab, run_order
from kvspec.bench.live.load import LoadResult, run_load
from kvspec.bench.live.render import plot
from kvspec.bench.live.schema import schema_problems
from kvspec.bench.live.stats import percentile, ratios, summarise_arm, summarise_run
from kvspec.bench.live.workload import ARMS, WorkloadShape, make_prompts
from kvspec.cli import main
from kvspec.report import ExitCode

ROOT = Path(__file__).resolve().parents[1]


class FakeVllm:
    """State of one fake server process: its prefix cache, counters and fault plan (by arrival order)."""

    def __init__(
        self,
        *,
        block_size: int = 4,
        base_ttft: float = 0.01,
        per_uncached: float = 0.0,
        itl: float = 0.005,
        fail_at: frozenset[int] = frozenset(),
        error_at: frozenset[int] = frozenset(),
        cut_at: frozenset[int] = frozenset(),
        headers_then_wait: bool = True,
    ) -> None:
        self.block_size, self.base_ttft, self.per_uncached, self.itl = block_size, base_ttft, per_uncached, itl
        self.fail_at, self.error_at, self.cut_at = fail_at, error_at, cut_at
        self.headers_then_wait = headers_then_wait
        self.lock = threading.Lock()
        self.cached_blocks: set[tuple[int, ...]] = set()
        self.arrivals = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.counters = dict.fromkeys(COUNTERS, 0.0)

    def admit(self, prompt: list[int]) -> tuple[int, int]:
        """(arrival index, cached tokens): whole leading blocks seen before, at least one token computed."""
        with self.lock:
            index = self.arrivals
            self.arrivals += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            bs = self.block_size
            cached = 0
            while cached + bs < len(prompt) and tuple(prompt[: cached + bs]) in self.cached_blocks:
                cached += bs
            for end in range(bs, len(prompt) + 1, bs):
                self.cached_blocks.add(tuple(prompt[:end]))
            self.counters["vllm:prefix_cache_queries_total"] += len(prompt)
            self.counters["vllm:prefix_cache_hits_total"] += cached
            self.counters["vllm:prompt_tokens_cached_total"] += cached
            self.counters["vllm:prompt_tokens_total"] += len(prompt)
            return index, cached

    def finish(self, output_tokens: int, ok: bool) -> None:
        with self.lock:
            self.in_flight -= 1
            if ok:
                self.counters["vllm:generation_tokens_total"] += output_tokens
                self.counters["vllm:request_success_total"] += 1

    def metrics_text(self) -> str:
        lines = []
        with self.lock:
            for name, value in self.counters.items():
                family = name.removesuffix("_total")
                lines += [f"# HELP {family} a counter", f"# TYPE {family} counter"]
                lines.append(f'{name}{{engine="0",model_name="fake"}} {value}')
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{self.block_size}",enable_prefix_caching="True",'
            'engine="0",num_gpu_blocks="64"} 1.0',
        ]
        return "\n".join(lines) + "\n"


def _handler(fake: FakeVllm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: str, content_type: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": "fake-tiny", "object": "model"}]}))
            elif self.path == "/metrics":
                self._send(200, fake.metrics_text(), "text/plain; version=0.0.4")
            elif self.path == "/health":
                self._send(200, "")
            else:
                self._send(404, "{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt, max_tokens = body["prompt"], body["max_tokens"]
            index, cached = fake.admit(prompt)
            if index in fake.fail_at:
                fake.finish(0, ok=False)
                self._send(500, json.dumps({"error": {"message": "injected failure", "code": 500}}))
                return
            wait = fake.base_ttft + fake.per_uncached * (len(prompt) - cached)
            if not fake.headers_then_wait:
                time.sleep(wait)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            if fake.headers_then_wait:
                time.sleep(wait)  # like vLLM: headers at once, the first token after the prefill
            for k in range(max_tokens):
                if k:
                    time.sleep(fake.itl)
                if index in fake.cut_at and k == 2:
                    fake.finish(0, ok=False)
                    self.close_connection = True
                    self.wfile.write(b"0\r\n\r\n")  # a clean end of body, but no [DONE]
                    return
                if index in fake.error_at and k == 1:
                    fake.finish(0, ok=False)  # before the client can see the end and send the next request
                    self._chunk('data: {"error": {"message": "injected stream error", "code": 500}}\n\n')
                    self._chunk("data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                choice = {"index": 0, "text": f" t{k}", "finish_reason": "length" if k == max_tokens - 1 else None}
                self._chunk(f"data: {json.dumps({'choices': [choice]})}\n\n")
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": max_tokens,
                "total_tokens": len(prompt) + max_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            # Leave the in-flight count before the client can see the end and send its next request.
            fake.finish(max_tokens, ok=True)
            self._chunk(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n")
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

    return Handler


@contextlib.contextmanager
def serve(fake: FakeVllm) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class FakeLauncher:
    """A fresh FakeVllm per launch, like a restarted server; remembers every instance in launch order."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.started: list[FakeVllm] = []

    @contextlib.contextmanager
    def __call__(self) -> Iterator[str]:
        fake = FakeVllm(**self.settings)
        self.started.append(fake)
        with serve(fake) as url:
            yield url


def _options(**overrides: Any) -> LiveOptions:
    """LiveOptions with the workload figures among ``overrides`` in its shape."""
    shape_keys = {f.name for f in dataclasses.fields(WorkloadShape)}
    shape = WorkloadShape(**{k: v for k, v in overrides.items() if k in shape_keys})
    return LiveOptions(shape=shape, **{k: v for k, v in overrides.items() if k not in shape_keys})


# --------------------------------------------------------------------------- workloads and statistics


def test_workloads_differ_only_in_what_they_share() -> None:
    shape = WorkloadShape(requests=6, prompt_tokens=40, shared_tokens=32, output_tokens=4, concurrency=2)
    unique, shared = make_prompts("unique", shape), make_prompts("shared", shape)
    assert len(unique) == len(shared) == 6
    assert {len(p) for p in unique} == {len(p) for p in shared} == {40}
    assert len({tuple(p[:4]) for p in unique}) == 6, "unique prompts must not share a first block"
    assert len({tuple(p[:32]) for p in shared}) == 1 and len({tuple(p[32:]) for p in shared}) == 6
    assert all(3 <= t < shape.vocab_size for p in unique + shared for t in p), "no special token ids"
    assert make_prompts("shared", shape) == shared, "prompts are reproducible from the seed"


def test_shape_problems_refuse_a_prefix_as_long_as_the_prompt() -> None:
    assert WorkloadShape().problems() == []
    assert any("S < P" in p for p in WorkloadShape(prompt_tokens=64, shared_tokens=64).problems())
    assert any("TPOT" in p for p in WorkloadShape(output_tokens=1).problems())


def test_run_order_alternates_so_each_arm_runs_first_and_second() -> None:
    order = run_order(3)
    assert [arm for _, _, arm in order] == ["unique", "shared", "shared", "unique", "unique", "shared"]
    assert [(pair, pos) for pair, pos, _ in order] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


def test_percentile_interpolates_between_order_statistics() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)
    assert percentile([3.0], 90) == 3.0
    assert percentile([], 90) is None


def test_summary_of_known_requests() -> None:
    requests = [
        RequestResult(0, True, 200, None, 0.0, 0.1, 1.1, 8, 11, 0),  # TTFT 0.1, TPOT 0.1
        RequestResult(1, True, 200, None, 1.0, 1.3, 2.3, 8, 11, 4),  # TTFT 0.3, TPOT 0.1
        RequestResult(2, False, 500, "HTTP 500: no", 1.0),
    ]
    s = summarise_run(LoadResult(requests, wall_s=2.0))
    assert (s["ok"], s["failures"], s["failure_reasons"]) == (2, 1, ["HTTP 500: no"])
    assert s["ttft_median_s"] == pytest.approx(0.2) and s["ttft_p90_s"] == pytest.approx(0.28)
    assert s["tpot_median_s"] == pytest.approx(0.1)
    assert s["requests_per_s"] == pytest.approx(1.0) and s["output_tokens_per_s"] == pytest.approx(11.0)
    assert s["cached_tokens_usage"] == 4


# --------------------------------------------------------------------------- the load generator on the fake


def test_ttft_is_the_first_token_not_the_headers_and_tpot_the_token_gap() -> None:
    fake = FakeVllm(base_ttft=0.15, itl=0.02)
    with serve(fake) as url:
        r = stream_completion(url, "fake-tiny", [5] * 8, 6)
    assert r.ok and r.error is None and r.output_tokens == 6 and r.cached_tokens == 0
    # The fake sends headers at once and the first token 150 ms later: a client timing the headers reads ~0.
    assert r.ttft_s is not None and r.ttft_s >= 0.15
    # The gap is timed on the client, where a late read of the first chunk shortens it a little: the
    # bound only has to tell the token gap (20 ms) from none.
    assert r.tpot_s is not None and 0.015 <= r.tpot_s < 0.2


def test_failures_are_counted_never_raised() -> None:
    shape = WorkloadShape(requests=8, prompt_tokens=8, shared_tokens=4, output_tokens=5, concurrency=2)
    fake = FakeVllm(fail_at=frozenset({2}), error_at=frozenset({4}), cut_at=frozenset({6}))
    with serve(fake) as url:
        load = run_load(url, "fake-tiny", make_prompts("unique", shape), 5, 2, timeout=10)
    s = summarise_run(load)
    assert (s["ok"], s["failures"]) == (5, 3)
    reasons = " | ".join(s["failure_reasons"])
    assert "HTTP 500" in reasons and "stream error" in reasons and "before data: [DONE]" in reasons
    assert s["output_tokens"] == 5 * 5, "failed requests add no output tokens"
    refused = stream_completion("http://127.0.0.1:9", "m", [5, 6], 3, timeout=2)  # nothing listens on port 9
    assert not refused.ok and refused.error is not None and "Connection" in refused.error


def test_concurrency_cap_and_throughput_over_wall_time() -> None:
    n, c, o, itl, ttft = 8, 2, 5, 0.01, 0.02
    fake = FakeVllm(base_ttft=ttft, itl=itl)
    shape = WorkloadShape(requests=n, prompt_tokens=8, shared_tokens=4, output_tokens=o, concurrency=c)
    with serve(fake) as url:
        load = run_load(url, "fake-tiny", make_prompts("unique", shape), o, c, timeout=10)
    s = summarise_run(load)
    assert fake.max_in_flight == c, "at most C requests in flight, and C reached"
    # Each request lasts at least ttft + (o - 1) * itl, and only c run at once.
    assert load.wall_s >= (n / c) * (ttft + (o - 1) * itl)
    assert s["requests_per_s"] == pytest.approx(n / load.wall_s)
    assert s["output_tokens_per_s"] == pytest.approx(n * o / load.wall_s)
    assert [r.index for r in load.requests] == list(range(n))


# --------------------------------------------------------------------------- the A/B driver, table, JSON


def test_ab_on_fake_restarts_per_run_and_the_shared_arm_hits(tmp_path: Path, capsys: Any) -> None:
    # Each uncached token costs 2 ms before the first token: the shared arm's hits must show in TTFT.
    launcher = FakeLauncher(block_size=4, base_ttft=0.005, per_uncached=0.002, itl=0.002)
    out = tmp_path / "ab.json"
    options = _options(
        requests=6, prompt_tokens=40, shared_tokens=32, output_tokens=4, concurrency=2, pairs=2,
        block_size=4, num_blocks=64, settle_s=0.0, json_path=out, quiet=True,
    )  # fmt: skip
    assert run_benchmark(options, launcher=launcher) == ExitCode.DONE
    result = json.loads(out.read_text())
    assert schema_problems(result) == []
    assert len(launcher.started) == 4, "a fresh server for every run"
    assert [r["arm"] for r in result["runs"]] == ["unique", "shared", "shared", "unique"]
    arms = result["arms"]
    # The fake caches a prompt's blocks on arrival: the first shared request misses, the 5 after it hit S=32.
    assert arms["unique"]["prefix_hit_tokens_usage"] == 0
    assert arms["shared"]["prefix_hit_tokens_usage"] == (6 - 1) * 32
    assert arms["shared"]["ttft_median_s"] < arms["unique"]["ttft_median_s"]
    for run in result["runs"]:
        assert (
            run["metrics_before"]["raw"].startswith("# HELP")
            and "vllm:prefix_cache_hits_total" in (run["metrics_after"]["raw"])
        )
    assert result["ratios_shared_over_unique"]["prefix_hit_tokens_usage"] is None, "x/0 has no finite ratio"
    for arm in ("unique", "shared"):
        assert [result["arms"][arm]["by_position"][p]["runs"] for p in ("first", "second")] == [1, 1]
    text = capsys.readouterr().out
    assert "shared/unique" in text and "order:" in text and text.count("\n") >= 10
    # A saved result redraws to the same table; a truncated one is refused with exit 2.
    assert main(["bench", "live", "--from-json", str(out)]) == ExitCode.DONE
    assert capsys.readouterr().out == text
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({k: v for k, v in result.items() if k != "arms"}))
    assert main(["bench", "live", "--from-json", str(broken)]) == ExitCode.COULD_NOT_RUN
    assert "arms.unique is missing" in capsys.readouterr().err


def test_one_pair_puts_each_arm_in_one_position_only() -> None:
    shape = WorkloadShape(requests=2, prompt_tokens=8, shared_tokens=4, output_tokens=2, concurrency=1)
    result = run_ab(FakeLauncher(), shape, 1, settle_s=0.0)
    unique, shared = result["arms"]["unique"]["by_position"], result["arms"]["shared"]["by_position"]
    assert (unique["first"]["runs"], unique["second"]["runs"]) == (1, 0) and unique["second"]["ttft_median_s"] is None
    assert (shared["first"]["runs"], shared["second"]["runs"]) == (0, 1) and shared["first"]["ttft_median_s"] is None


def test_plot_is_drawn_when_matplotlib_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot is optional: matplotlib is not a dependency of the kit")
    shape = WorkloadShape(requests=4, prompt_tokens=8, shared_tokens=4, output_tokens=3, concurrency=2)
    result = run_ab(FakeLauncher(), shape, 1, settle_s=0.0)
    result["configuration"] = configuration(LiveOptions(shape=shape))
    png = tmp_path / "ab.png"
    assert plot(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_metric_deltas_come_from_the_raw_metrics_text(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="/metrics parsing needs prometheus-client (the vllm extra)")
    launcher = FakeLauncher(block_size=4)
    shape = WorkloadShape(requests=4, prompt_tokens=16, shared_tokens=12, output_tokens=3, concurrency=1)
    result = run_ab(launcher, shape, 1, settle_s=0.0)
    for run in result["runs"]:
        delta = run["metrics_delta"]
        assert delta["vllm:prefix_cache_hits_total"] == run["summary"]["cached_tokens_usage"]
        assert delta["vllm:generation_tokens_total"] == 4 * 3
        assert run["cache_config"]["block_size"] == "4"
    shared = next(r for r in result["runs"] if r["arm"] == "shared")
    assert shared["metrics_delta"]["vllm:prefix_cache_hits_total"] == 3 * 12


def test_server_that_cannot_start_exits_2_with_the_log_tail(tmp_path: Path, capsys: Any) -> None:
    @contextlib.contextmanager
    def broken() -> Iterator[str]:
        raise ServerDidNotStart("the server exited with code 1 before it was healthy", "ValueError: boom")
        yield "unreachable"

    out = tmp_path / "ab.json"
    code = run_benchmark(_options(requests=2, settle_s=0.0, json_path=out, quiet=True), launcher=broken)
    assert code == ExitCode.COULD_NOT_RUN
    assert "ValueError: boom" in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["exit_code"] == 2 and result["server_log_tail"] == "ValueError: boom"


def test_ctrl_c_keeps_the_runs_done_so_far(tmp_path: Path, capsys: Any) -> None:
    launcher = FakeLauncher()

    @contextlib.contextmanager
    def interrupted_on_second_launch() -> Iterator[str]:
        if launcher.started:
            raise KeyboardInterrupt
        with launcher() as url:
            yield url

    out = tmp_path / "ab.json"
    options = _options(
        requests=2, prompt_tokens=8, shared_tokens=4, output_tokens=2, settle_s=0.0, json_path=out, quiet=True
    )
    assert run_benchmark(options, launcher=interrupted_on_second_launch) == ExitCode.COULD_NOT_RUN
    result = json.loads(out.read_text())
    assert schema_problems(result) == []
    assert result["error"] == "interrupted" and [r["arm"] for r in result["runs"]] == ["unique"]
    assert "interrupted" in capsys.readouterr().err


def test_schema_problems_name_what_is_missing() -> None:
    good: dict[str, Any] = {"runs": []}
    assert any("kvspec_bench_live" in p for p in schema_problems(good))
    launcher = FakeLauncher()
    shape = WorkloadShape(requests=2, prompt_tokens=8, shared_tokens=4, output_tokens=2, concurrency=1)
    result = {"kvspec_bench_live": 1, "configuration": {}, "exit_code": 0, "duration_s": 0.1, "started_at": "x"}
    result |= run_ab(launcher, shape, 1, settle_s=0.0)
    result["configuration"] = configuration(_options(requests=2, prompt_tokens=8, shared_tokens=4))
    assert schema_problems(result) == []
    del result["runs"][1]["summary"]["ttft_median_s"]
    assert any("runs[1].summary.ttft_median_s" in p for p in schema_problems(result))
    result["arms"]["shared"]["failures"] = "none"
    assert any("arms.shared.failures" in p for p in schema_problems(result))


def test_committed_result_matches_the_schema() -> None:
    path = ROOT / "docs" / "bench-live.json"
    if not path.exists():
        pytest.fail("docs/bench-live.json is missing: run the command in docs/bench-live.md")
    result = json.loads(path.read_text())
    assert schema_problems(result) == []
    assert result["exit_code"] == 0 and len(result["runs"]) == 2 * result["configuration"]["pairs"]
    # Every figure is recomputed from the raw per-request records it was summarised from.
    for run in result["runs"]:
        assert summarise_run(_reload(run)) == run["summary"]
    arms = {arm: summarise_arm([r for r in result["runs"] if r["arm"] == arm]) for arm in ARMS}
    assert arms == result["arms"]
    assert ratios(arms["unique"], arms["shared"]) == result["ratios_shared_over_unique"]
    assert arms["shared"]["prefix_hit_tokens_usage"] > arms["unique"]["prefix_hit_tokens_usage"]


def _reload(run: dict[str, Any]) -> LoadResult:
    fields = [{k: v for k, v in r.items() if k not in ("ttft_s", "tpot_s")} for r in run["requests"]]
    return LoadResult([RequestResult(**f) for f in fields], run["summary"]["wall_s"])


def test_a_recomputed_summary_catches_an_edited_request() -> None:
    shape = WorkloadShape(requests=3, prompt_tokens=8, shared_tokens=4, output_tokens=3, concurrency=1)
    run = json.loads(json.dumps(run_ab(FakeLauncher(), shape, 1, settle_s=0.0)["runs"][0]))
    assert summarise_run(_reload(run)) == run["summary"]
    run["requests"][0]["first_token_s"] += 1.0  # a hand-edited TTFT
    assert summarise_run(_reload(run)) != run["summary"]


# --------------------------------------------------------------------------- the real vLLM server


def test_small_ab_on_the_real_server(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vLLM extra not installed: pip install kvspec[vllm]")
    pytest.importorskip("prometheus_client", reason="vLLM's /metrics parsing needs prometheus-client")
    out = tmp_path / "ab.json"
    assert main(["bench", "live", "-n", "8", "-c", "2", "--pairs", "1", "--json", str(out), "--quiet"]) == ExitCode.DONE
    result = json.loads(out.read_text())
    assert schema_problems(result) == []
    unique, shared = result["arms"]["unique"], result["arms"]["shared"]
    assert unique["failures"] == shared["failures"] == 0
    assert shared["prefix_hit_tokens_usage"] > unique["prefix_hit_tokens_usage"]
    assert shared["prefix_cache_hits_metric"] > unique["prefix_cache_hits_metric"]
    assert result["configuration"]["server_cache_config"]["num_gpu_blocks"] == "64"
