"""The result's contract: the JSON Schema ``kvspec/schemas/bench-live.schema.json``, version SCHEMA_VERSION.

The schema spells out the counters of :data:`.run.COUNTERS` and the ratios of :data:`.stats.RATIO_KEYS`
(a result must have exactly those): when either changes, the schema and SCHEMA_VERSION change with it.
"""

from __future__ import annotations

from typing import Any

from kvspec.schemas import problems

SCHEMA_VERSION = 1


def schema_problems(result: Any) -> list[str]:
    """Every way ``result`` departs from the bench-live JSON schema (empty when it conforms), one line each.

    A result that could not run (exit code 2) needs ``error`` and ``server_log_tail`` instead of arms.
    """
    return problems(result, "bench-live")
