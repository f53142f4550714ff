"""The live vLLM adapter against a real server (the kit's tiny one, started once for the module).

Needs vLLM with its ZMQ, msgspec and prometheus-client dependencies (the vLLM CPU venv of
.ci/run); skipped elsewhere, where tests/test_stream_checks.py covers the checks on a recorded log.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the live adapter needs vLLM (pip install kvspec[vllm])")
pytest.importorskip("zmq", reason="KV events need pyzmq (a vLLM dependency)")
pytest.importorskip("msgspec", reason="KV events are decoded with msgspec (a vLLM dependency)")
pytest.importorskip("prometheus_client", reason="/metrics is parsed with prometheus-client (a vLLM dependency)")

from kvspec.adapters.vllm_live.adapter import VllmLiveAdapter
from kvspec.adapters.vllm_live.events import EventSubscriber
from kvspec.adapters.vllm_live.recorded import check_recorded, load_log
from kvspec.adapters.vllm_live.server import Endpoints, group_alive
from kvspec.stateful_tests.live import Burst, LiveProfile, run_live, stream_rows

SMALL = LiveProfile("small", exact_requests=40, bursts=(Burst("pressure", 8, 200, 250),), max_new_tokens=24)


def attached(ep: Endpoints, record: Path | None = None) -> VllmLiveAdapter:
    adapter = VllmLiveAdapter()
    adapter.configure(url=ep.url, events=ep.events, replay=ep.replay, record=record)
    return adapter


def test_exact_mode_holds_and_predicts_every_hit(vllm_live_server: Endpoints, tmp_path: Path) -> None:
    log = tmp_path / "exact.jsonl"
    result = run_live(attached(vllm_live_server, log), profile=SMALL, seed=3, mode="exact", cases_dir=tmp_path)
    assert result.status == "passed", (result.error, result.findings)
    verdicts = {r["name"]: r for r in result.report().verdicts()}
    assert verdicts["predicted_cached_tokens"]["verdict"] == "held"
    assert verdicts["predicted_cached_tokens"]["checked_steps"] >= 30
    assert result.coverage["exact hits"] > 0 and result.stream is not None and result.stream.seen["removed"] > 0
    # The recorded log re-checks offline to the same verdicts.
    assert [row.to_json() for row in stream_rows(check_recorded(load_log(log)))] == result.report().verdicts()


def test_a_load_burst_reaches_preemptions_and_stays_within_bounds(vllm_live_server: Endpoints, tmp_path: Path) -> None:
    """Every run passes; the bursts are run again with the next seed (three at most) until one preempts: on
    loaded cores the server can drain a burst's requests one by one and never run out of blocks."""
    for seed in (4, 5, 6):
        result = run_live(
            attached(vllm_live_server), profile=SMALL, seed=seed, mode="load", cases_dir=tmp_path / str(seed)
        )
        assert result.status == "passed", (seed, result.error, result.findings)
        verdicts = {r["name"]: r["verdict"] for r in result.report().verdicts()}
        assert verdicts["cached_tokens_within_bounds"] == "held" and verdicts["cached_within_pool"] == "held"
        if result.live["preemptions"] > 0:
            return
    raise AssertionError("three load runs of the pressure burst reached no preemption")


def publish_until_heard(ep: Endpoints, subscriber: EventSubscriber, first_token: int) -> None:
    """Run small workloads until the subscriber has heard a live batch.

    A ZMQ SUB socket joins asynchronously: batches published before its subscription reaches the
    server are not delivered (ZMQ's "slow joiner"), so on a loaded machine one workload can end
    before a late subscriber hears anything, and then nothing triggers its replay. The batches it
    missed are what these tests are about; the first one it hears is what makes it ask for them.
    """
    for attempt in range(5):
        start = first_token + 100 * attempt
        with attached(ep) as adapter:
            adapter.complete(list(range(start, start + 80)), 4)
            adapter.settle()
        subscriber.wait_quiet()
        if subscriber.batches or subscriber.gaps:
            return
    raise AssertionError("the subscriber heard no batch in five workloads")


def test_a_late_subscriber_gets_the_missed_batches_from_the_replay_socket(vllm_live_server: Endpoints) -> None:
    ep = vllm_live_server
    with attached(ep) as adapter:  # makes sure the server has published batches before we join
        adapter.complete(list(range(10, 80)), 4)
        adapter.settle()
    subscriber = EventSubscriber(ep.events or "", ep.replay, topic=ep.topic, start_seq=0).start()
    try:
        publish_until_heard(ep, subscriber, first_token=100)
        seqs = [b["seq"] for b in subscriber.batches]
        assert seqs[0] == 0 and seqs == list(range(len(seqs))), seqs
        assert subscriber.replayed > 0 and subscriber.gaps == []
    finally:
        subscriber.close()


def test_without_a_replay_socket_a_missed_batch_is_a_reported_gap(vllm_live_server: Endpoints) -> None:
    ep = vllm_live_server
    subscriber = EventSubscriber(ep.events or "", None, topic=ep.topic, start_seq=0).start()
    try:
        publish_until_heard(ep, subscriber, first_token=200)
        assert subscriber.gaps and subscriber.gaps[0][0] == 0
    finally:
        subscriber.close()


def test_serve_tiny_serves_until_interrupted_and_leaves_no_process(tmp_path: Path) -> None:
    info_path = tmp_path / "endpoints.json"
    cli = subprocess.Popen(
        [sys.executable, "-m", "kvspec.cli", "serve-tiny", "--json", str(info_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while not info_path.exists() and cli.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert info_path.exists(), cli.stdout.read().decode()[-3000:] if cli.poll() is not None and cli.stdout else ""
        info = json.loads(info_path.read_text())
        assert info["url"].startswith("http://127.0.0.1:") and info["events"].startswith("ipc://")
        with urllib.request.urlopen(f"{info['url']}/health", timeout=10) as response:
            assert response.status == 200
        assert group_alive(info["pid"])
        cli.send_signal(signal.SIGINT)
        assert cli.wait(timeout=60) == 0
        assert not group_alive(info["pid"])  # the server and its engine core are gone
        assert not Path(info["events"].removeprefix("ipc://")).parent.exists()  # the private folder too
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
