"""The result's contract, version SCHEMA_VERSION: every key a result must have, and its type."""

from __future__ import annotations

from typing import Any

from kvspec.report import ExitCode

from .run import COUNTERS
from .stats import RATIO_KEYS
from .workload import ARMS

SCHEMA_VERSION = 1

_Types = tuple[type, ...]
_NUM: _Types = (int, float)
_OPT_NUM: _Types = (int, float, type(None))
_STR: _Types = (str,)
_LIST: _Types = (list,)
SCHEMA: dict[str, dict[str, _Types]] = {
    "": {
        "kvspec_bench_live": (int,),
        "started_at": (str,),
        "duration_s": _NUM,
        "configuration": (dict,),
        "runs": (list,),
        "exit_code": (int,),
    },
    "configuration": dict.fromkeys(
        [
            "requests",
            "prompt_tokens",
            "shared_tokens",
            "output_tokens",
            "concurrency",
            "pairs",
            "block_size",
            "num_blocks",
            "max_num_seqs",
            "cpu_count",
        ],
        (int,),
    )
    | {"vllm": (str, type(None))},
    "run": {"arm": _STR}
    | dict.fromkeys(["run", "pair", "position"], (int,))
    | {"startup_s": _NUM, "loadavg_1m": _LIST}
    | dict.fromkeys(["summary", "metrics_before", "metrics_after", "metrics_delta", "cache_config"], (dict,))
    | {"requests": _LIST},
    "summary": dict.fromkeys(["requests", "ok", "failures", "output_tokens", "merged_chunk_requests"], (int,))
    | {"failure_reasons": (list,), "wall_s": _NUM}
    | dict.fromkeys(
        [
            "requests_per_s",
            "output_tokens_per_s",
            "ttft_median_s",
            "ttft_p90_s",
            "tpot_median_s",
            "tpot_p90_s",
            "cached_tokens_usage",
        ],
        _OPT_NUM,
    ),
    "metrics": {"counters": (dict,), "raw": (str,)},
    "arm": dict.fromkeys(["runs", "requests", "failures"], (int,))
    | {"by_position": (dict,)}
    | dict.fromkeys(
        [
            "ttft_median_s",
            "ttft_p90_s",
            "tpot_median_s",
            "tpot_p90_s",
            "requests_per_s",
            "output_tokens_per_s",
            "prefix_hit_tokens_usage",
            "prefix_cache_hits_metric",
            "prompt_tokens_cached_metric",
            "preemptions_metric",
        ],
        _OPT_NUM,
    ),
}


def _check(where: str, obj: Any, kind: str) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where or 'the result'} is not an object"]
    out = []
    for key, types in SCHEMA[kind].items():
        path = f"{where}.{key}" if where else key
        if key not in obj:
            out.append(f"{path} is missing")
        elif not isinstance(obj[key], types) or isinstance(obj[key], bool):
            out.append(f"{path} is {type(obj[key]).__name__}, not {' or '.join(t.__name__ for t in types)}")
    return out


def schema_problems(result: Any) -> list[str]:
    """Every way ``result`` departs from the bench-live JSON schema (empty when it conforms).

    A result that could not run (exit code 2) needs ``error`` and ``server_log_tail`` instead of arms.
    """
    out = _check("", result, "")
    if out:
        return out
    out += _check("configuration", result["configuration"], "configuration")
    for i, run in enumerate(result["runs"]):
        out += _check(f"runs[{i}]", run, "run")
        if isinstance(run, dict):
            for part, kind in (("summary", "summary"), ("metrics_before", "metrics"), ("metrics_after", "metrics")):
                if isinstance(run.get(part), dict):
                    out += _check(f"runs[{i}].{part}", run[part], kind)
            delta = run.get("metrics_delta")
            if isinstance(delta, dict) and set(delta) != set(COUNTERS):
                out.append(f"runs[{i}].metrics_delta must have exactly the counters {', '.join(COUNTERS)}")
    if result["exit_code"] == ExitCode.COULD_NOT_RUN:
        return out + [f"{key} is missing" for key in ("error", "server_log_tail") if key not in result]
    for arm in ARMS:
        arms = result.get("arms")
        if not isinstance(arms, dict) or arm not in arms:
            out.append(f"arms.{arm} is missing")
        else:
            out += _check(f"arms.{arm}", arms[arm], "arm")
    ratio = result.get("ratios_shared_over_unique")
    if not isinstance(ratio, dict) or set(ratio) != set(RATIO_KEYS):
        out.append(f"ratios_shared_over_unique must have exactly {', '.join(RATIO_KEYS)}")
    return out
