"""``--shard i/n`` of the release matrix scripts: n shards run every item exactly once; a bad shard is a usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.bench import shard

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12])
def test_the_shards_together_run_every_item_exactly_once(n: int) -> None:
    items = [f"0.{minor}.{patch}" for minor in range(10, 14) for patch in range(3)]
    parts = [shard.take(items, shard.parse(f"{i}/{n}")) for i in range(1, n + 1)]
    assert sorted(x for part in parts for x in part) == sorted(items)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1  # balanced
    assert shard.take(items, None) == items
    if 1 < n < len(items):
        assert parts[0][:2] == [items[0], items[n]]  # neighbours go to different shards


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1/0", "2", "a/b", "1/2/3", ""])
def test_a_shard_outside_one_to_n_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--shard must be i/n"):
        shard.parse(bad)


@pytest.mark.parametrize("script", ["vllm_matrix.py", "sglang_matrix.py", "nanovllm_matrix.py"])
def test_each_matrix_script_takes_a_shard(script: str) -> None:
    path = ROOT / "benchmarks" / script
    shown = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, check=False)
    assert shown.returncode == 0 and "--shard I/N" in shown.stdout
    bad = subprocess.run([sys.executable, str(path), "--shard", "4/3"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--shard must be i/n" in bad.stderr
