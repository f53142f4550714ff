"""kvspec.bench.child: a child's peak memory is its own, not the parent's it was forked from."""

from __future__ import annotations

from pathlib import Path

from kvspec.bench.child import kvspec_in_child

LOG = Path(__file__).parent / "data" / "vllm_live_cpu.jsonl"


def test_peak_rss_is_the_childs_own() -> None:
    alone = kvspec_in_child(["trace", "check", str(LOG), "--format", "vllm-events"])
    held = bytearray(256 * 2**20)  # touched, so the parent's resident set really holds it when the child forks
    held[::4096] = b"\x01" * len(held[::4096])
    beside = kvspec_in_child(["trace", "check", str(LOG), "--format", "vllm-events"])
    assert alone.exit_code == beside.exit_code == 0
    assert 0 < alone.peak_rss_mb < 200
    # ru_maxrss would carry the parent's 256 MB over fork and exec: the same check must measure about the same
    assert beside.peak_rss_mb < alone.peak_rss_mb + 64, (alone, beside)
    assert len(held) == 256 * 2**20
