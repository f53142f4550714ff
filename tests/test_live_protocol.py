"""The LiveAdapter protocol is enough to check another server: a fake engine's adapter through the kit's runner.

tests/fake_live_server.py is a tiny engine with a real prefix cache behind HTTP; tests/fake_live_adapter.py
implements ``kvspec.adapter.LiveAdapter`` for it, importing the kit only from ``kvspec.adapter``. Neither the
runner (stateful_tests/live.py) nor the dispatch was edited for it.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest
from fake_live_adapter import FakeLiveAdapter
from fake_live_server import FakeServer

from kvspec.adapter import LiveAdapter
from kvspec.report import ExitCode
from kvspec.spec.stream import STREAM_INVARIANT_NAMES
from kvspec.stateful_tests.dispatch import check_adapter
from kvspec.stateful_tests.options import LiveTarget, Options

ROOT = Path(__file__).resolve().parent.parent
SEED = 0  # a seed whose exact prompts include a whole-block repeat (where the hit cap bites)
LOST_HITS = "predicted_cached_tokens"  # the stream check of an exact request's cached tokens (spec/stream.py)


def _options(cases: Path) -> Options:
    return Options(seed=SEED, cases_dir=cases, live=LiveTarget(mode="both"))


def test_fake_server_really_reuses_its_cache() -> None:
    """The engine's hits come from its cache: whole blocks, capped so one prompt token is computed, LRU-evicted."""
    engine = FakeServer(num_blocks=4, block_size=4, max_model_len=16).engine
    prompt = list(range(3, 12))  # 9 tokens: 2 whole blocks
    assert engine.complete(prompt, 1)[1] == 0
    assert engine.complete(prompt, 1)[1] == 8
    assert engine.complete(prompt[:8], 1)[1] == 4  # 8 tokens: the cap leaves the second block to compute
    assert engine.complete(list(range(20, 35)), 1)[1] == 0  # 15 + 1 tokens take the whole pool: all evicted
    assert engine.complete(prompt, 1)[1] == 0
    assert engine.metrics()["kv_cache_usage_perc"] == 0.0
    assert engine.reset() and engine.complete(prompt, 1)[1] == 0


def test_fake_adapter_has_every_protocol_member() -> None:
    """Every method, property and attribute LiveAdapter declares is on the fake adapter."""
    declared = {m for m in dir(LiveAdapter) if not m.startswith("_")} | set(LiveAdapter.__annotations__)
    assert {"name", "capabilities", "startup_s", "complete", "check", "records"} <= declared
    adapter = FakeLiveAdapter()
    missing = sorted(m for m in declared if not hasattr(type(adapter), m) and not hasattr(adapter, m))
    assert missing == []
    assert adapter.capabilities.live


def test_fake_live_adapter_passes_through_check_adapter(tmp_path: Path) -> None:
    report = check_adapter(FakeLiveAdapter, "fake-live", _options(tmp_path))
    assert report.error == ""
    assert report.status == "passed", report.table()
    assert report.exit_code == ExitCode.HELD
    assert report.steps > 0 and report.examples > 0
    verdicts = {row.name: row.verdict for row in report.rows}
    assert verdicts == dict.fromkeys(STREAM_INVARIANT_NAMES, "held"), report.table()
    predicted = next(row for row in report.rows if row.name == LOST_HITS)
    assert predicted.checked_steps > 20
    assert report.coverage["exact hits"] > 0  # the predictions judged real reuse, not only cold misses
    assert report.sections["live"]["pool"] == {"block_size": 16, "num_gpu_blocks": 64}
    assert not list(tmp_path.iterdir())  # no counterexample saved


def test_a_server_that_forgets_its_hits_is_reported(tmp_path: Path) -> None:
    factory = functools.partial(FakeLiveAdapter, forget_hits=True)
    report = check_adapter(factory, "fake-live", _options(tmp_path))
    assert report.status == "violated", report.table()
    assert report.exit_code == ExitCode.VIOLATED
    assert report.verdict(LOST_HITS) == "violated"
    assert report.verdict("hash_chain_agrees") == "held"  # the events it publishes are still honest
    finding = next(f for f in report.findings if f["invariant"] == LOST_HITS)
    assert "got cached_tokens=0" in finding["problems"][0]
    [case] = report.cases
    assert LOST_HITS in Path(case).name and Path(case).parent == tmp_path
    records = [json.loads(line) for line in Path(case).read_text().splitlines()]
    bad = next(r["request"] for r in records if r.get("request", {}).get("id") == finding["request"])
    assert bad["cached_tokens"] == 0 and bad["mode"] == "exact"


def _imports(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules.append("." * node.level + (node.module or ""))
    return modules


@pytest.mark.parametrize("module", ["stateful_tests/live.py", "stateful_tests/dispatch.py"])
def test_the_runner_does_not_import_the_vllm_adapter(module: str) -> None:
    imports = _imports(ROOT / module)
    assert imports  # the parse found the imports
    assert [m for m in imports if "vllm" in m] == []
    assert [m for m in imports if "adapters" in m.split(".")] in ([], ["kvspec.adapters.isolation"])


def test_the_runner_is_typed_to_the_protocol() -> None:
    tree = ast.parse((ROOT / "stateful_tests/live.py").read_text())
    assert "kvspec.adapter" in _imports(ROOT / "stateful_tests/live.py")
    annotations = {
        node.name: ast.unparse(arg.annotation)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        for arg in node.args.args + node.args.kwonlyargs
        if arg.arg == "adapter" and arg.annotation is not None
    }
    assert {"run_live", "run_exact", "run_load", "__init__"} <= set(annotations)
    assert set(annotations.values()) == {"LiveAdapter"}
