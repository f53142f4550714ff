"""A vLLM server's /metrics, parsed with prometheus-client: the gauges the stream checks read, the counters
the live benchmark records.

Counters keep their ``_total`` sample names; a metric with several label sets (one per engine) is
summed. ``vllm:cache_config_info`` is an info-style gauge whose labels carry the cache shape. A
sample the page does not have reads as None: unavailable, never zero.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .client import metrics_text

USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
SNAPSHOT_SAMPLES = (USAGE, PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS)


@dataclass(frozen=True)
class Metrics:
    """Sample name -> value (summed over label sets), and the cache_config_info labels."""

    values: dict[str, float] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def counters(self, names: Iterable[str]) -> dict[str, float | None]:
        """Each named sample's value; None where the page does not have it."""
        return {name: self.values.get(name) for name in names}

    @property
    def block_size(self) -> int | None:
        value = self.cache_config.get("block_size")
        return int(value) if value and value.isdigit() else None

    @property
    def num_gpu_blocks(self) -> int | None:
        value = self.cache_config.get("num_gpu_blocks")
        return int(value) if value and value.isdigit() else None

    @property
    def hash_algo(self) -> str:
        return self.cache_config.get("prefix_caching_hash_algo", "sha256")

    def snapshot(self, ts: float, idle: bool) -> dict[str, Any]:
        """A ``metrics`` record line's body: short names (``kv_cache_usage_perc``, ...) for the gauges read."""
        out: dict[str, Any] = {"ts": ts, "idle": idle}
        for name in SNAPSHOT_SAMPLES:
            if name in self.values:
                out[name.removeprefix("vllm:")] = self.values[name]
        return out


def parse_metrics(text: str) -> Metrics:
    """Parse Prometheus exposition text into :class:`Metrics`."""
    # prometheus-client comes with vLLM, not with the kit: imported by name when used.
    parser: Any = importlib.import_module("prometheus_client.parser")
    values: dict[str, float] = {}
    info: dict[str, str] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == CACHE_CONFIG_INFO:
                info = dict(sample.labels)
                continue
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return Metrics(values, info)


def read_metrics(url: str, timeout: float = 10.0) -> Metrics:
    """GET ``url``/metrics and parse it."""
    return parse_metrics(metrics_text(url, timeout))


def counter_deltas(before: Mapping[str, float | None], after: Mapping[str, float | None]) -> dict[str, float | None]:
    """after - before for each counter of ``before``; None where either side lacks it."""
    deltas: dict[str, float | None] = {}
    for name, first in before.items():
        last = after.get(name)
        deltas[name] = None if first is None or last is None else last - first
    return deltas
