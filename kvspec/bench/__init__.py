"""Benchmarks of eviction policies on engine-like workloads: generators, replay, metrics, the A/B table."""

from __future__ import annotations

from .workloads import GENERATORS, Workload, generate, generate_all

__all__ = ["GENERATORS", "Workload", "generate", "generate_all"]
