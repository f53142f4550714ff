"""benchmarks/stream_floor.py, the event benchmark's peer: it really reads, decodes and rehashes the whole stream."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kvspec.bench.vllm_stream import StreamShape, generate

pytest.importorskip("msgspec", reason="the floor decodes with msgspec (the events extra)")


def _load() -> tuple[Callable[..., dict[str, int]], Callable[[list[str]], int]]:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "stream_floor.py"
    spec = importlib.util.spec_from_file_location("kvspec_bench_stream_floor", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.floor, module.main


floor, main = _load()

SHAPE = StreamShape(blocks=256, events=3_000, reset_every=1_000)


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    path = tmp_path_factory.mktemp("floor") / "stream.jsonl"
    return path, generate(path, SHAPE)


def test_floor_does_every_event_and_every_hash(stream: tuple[Path, dict[str, int]]) -> None:
    path, made = stream
    done = floor(path)
    batches = [json.loads(line) for line in path.read_text().splitlines() if line.startswith('{"seq"')]
    events = [e for batch in batches for e in batch["events"]]
    assert done["lines"] == len(batches) + 1  # and the config record
    assert done["events"] == len(events) == made["events"]
    assert done["stored"] == sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored") > 0
    assert done["mismatched"] == 0  # the recipe gives every published hash of a hash-consistent stream


def test_floor_rehashes_for_real(stream: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    """One published hash changed: the recipe no longer gives it (nor its child's, chained from a lost parent)."""
    path, _ = stream
    lines = path.read_text().splitlines()
    n, line = next((i, line) for i, line in enumerate(lines) if '"block_hashes":[' in line and "BlockStored" in line)
    batch = json.loads(line)
    stored = next(e for e in batch["events"] if e["type"] == "BlockStored")
    stored["block_hashes"][0] ^= 1
    lines[n] = json.dumps(batch)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    assert floor(broken)["mismatched"] >= 1


def test_main_prints_the_counts_and_refuses_bad_usage(
    stream: tuple[Path, dict[str, int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, made = stream
    assert main([str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["events"] == made["events"]
    assert main([]) == 2
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "usage" in err and "missing.jsonl" in err and "Traceback" not in err


def test_floor_reads_the_block_size_of_the_config(tmp_path: Path) -> None:
    """A stream of 8-token blocks: read as 16-token ones, no BlockStored would carry its blocks' tokens."""
    path = tmp_path / "bs8.jsonl"
    generate(path, StreamShape(blocks=128, events=500, block_size=8))
    done = floor(path)
    assert done["stored"] > 0 and done["mismatched"] == 0


def test_a_store_without_its_blocks_tokens_is_mismatched(stream: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    path, _ = stream
    lines = path.read_text().splitlines()
    n, line = next((i, line) for i, line in enumerate(lines) if "BlockStored" in line)
    batch = json.loads(line)
    stored = next(e for e in batch["events"] if e["type"] == "BlockStored")
    stored["token_ids"] = stored["token_ids"][:-1]
    lines[n] = json.dumps(batch)
    broken = tmp_path / "short.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    assert floor(broken)["mismatched"] >= len(stored["block_hashes"])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json\n", "line 1: not JSON"),
        ("[1]\n", "line 1: expected a JSON object"),
        ('{"config": {"block_size": "x"}}\n', "line 1: malformed config record"),
        ('{"config": {}}\n{"seq": 0, "ts": 1, "events": [{"type": "BlockStored"}]}\n', "line 2: malformed batch"),
    ],
)
def test_a_malformed_stream_is_one_line_and_exit_2(
    text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ["vllm_live_cpu.jsonl", "vllm_live_delayed_reply.jsonl"])
def test_floor_gives_every_hash_of_a_real_vllm_log(name: str) -> None:
    """Logs recorded from a real vLLM 0.32 server (requests, gauges and resets between the batches)."""
    path = Path(__file__).parent / "data" / name
    events = [e for line in path.read_text().splitlines() for e in json.loads(line).get("events", [])]
    done = floor(path)
    assert done["events"] == len(events) > 0
    assert done["stored"] == sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored") > 0
    assert done["mismatched"] == 0
