"""The example database shared through a real redis-server (``--example-db redis://...``, stateful_tests/example_db.py).

A module fixture starts Debian's redis-server on a free loopback port with no persistence
(``--save '' --appendonly no``, its dir a temporary folder) and stops it. Without
redis-server the tests that need one skip with the reason, except under
``KVSPEC_REQUIRE_REDIS=1`` (CI), where they fail. The URL checks need no server.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clirun import kvspec

from kvspec.cli import main
from kvspec.gate.config import load as load_gate
from kvspec.stateful_tests.case_db import kept_cases
from kvspec.stateful_tests.example_db import ExampleDbError, open_example_db, parse_example_db

BUG = "eager-reclaim"  # a refinement bug Hypothesis shrinks in a few seconds (docs/benchmarks/workers.md)
INVARIANT = "predicted_free_capacity"
BUGGY = f"from seeded_bugs import SEEDED_BUGS\nFactory = next(b for b in SEEDED_BUGS if b.name == {BUG!r}).factory\n"
FIXED = "from kvspec.adapters.reference_paged import ReferencePagedAdapter as Factory\n"
ADAPTER = "shared_alloc:Factory"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of this test module on 127.0.0.1, its URL; stopped at the end."""
    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("KVSPEC_REQUIRE_REDIS") == "1":
            pytest.fail("KVSPEC_REQUIRE_REDIS=1 but redis-server is not installed (apt-get install redis-server)")
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    folder = tmp_path_factory.mktemp("redis")
    port = _free_port()
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen([*args, "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                open_example_db(url, "ping")
                break
            except ExampleDbError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not come up on port {port} (exit {process.poll()})")
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def _check(tmp_path: Path, url: str | None, report: str, *extra: str) -> tuple[int | None, dict]:  # type: ignore[type-arg]
    db = [] if url is None else ["--example-db", url]
    run = kvspec(
        "check", "--adapter", ADAPTER, "--no-scenarios", "--quiet", *db,
        "--cases-dir", str(tmp_path / "cases"), "--report", str(tmp_path / report), *extra,
        cwd=tmp_path, limit=240,
    )  # fmt: skip
    assert run.code in (0, 1), run.err
    return run.code, json.loads((tmp_path / report).read_text())


@pytest.mark.parametrize("engine", ["swarm", "hypothesis"])
@pytest.mark.slow
def test_a_counterexample_found_by_a_worker_is_replayed_first_by_a_fresh_process(
    tmp_path: Path, redis_url: str, engine: str
) -> None:
    """Two worker processes find a seeded bug and keep it in Redis (the swarm as kept cases, Hypothesis as its own
    examples); a fresh process with the Hypothesis engine fails on its very first example; once the adapter is
    fixed, the next process replays what was kept, holds, and Redis no longer keeps it."""
    url = redis_url.removesuffix("0") + ("1" if engine == "swarm" else "2")  # a database of its own per case
    module = tmp_path / "shared_alloc.py"
    module.write_text(BUGGY)
    code, found = _check(tmp_path, url, "found.json", "--engine", engine, "--workers", "2", "--max-examples", "10")
    assert code == 1 and [w["status"] for w in found["workers"]] == ["violated"] * 2
    assert next(r for r in found["invariants"] if r["name"] == INVARIANT)["verdict"] == "violated"
    database = open_example_db(parse_example_db(url), ADAPTER)
    assert database is not None
    kept = kept_cases(database)
    assert (len(kept) >= 1) if engine == "swarm" else (kept == [])  # Hypothesis keeps its own examples

    if engine == "hypothesis":  # seed 99, which no worker ran, does not fail on its first example by itself
        code, alone = _check(tmp_path, None, "alone.json", "--seed", "99", "--max-examples", "5")
        assert alone["examples_to_first_failure"] != 1
    code, again = _check(tmp_path, url, "again.json", "--seed", "99", "--max-examples", "5")
    assert code == 1
    assert again["examples_to_first_failure"] == 1  # the first example it ran was the kept counterexample
    assert again["kept_cases"] == len(kept)

    module.write_text(FIXED)
    code, fixed = _check(tmp_path, url, "fixed.json", "--seed", "99", "--max-examples", "5")
    assert code == 0 and fixed["kept_cases"] == len(kept)
    assert kept_cases(database) == []


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:6379/0", "an example database URL is redis:// or rediss://, not http://"),
        ("redis://127.0.0.1:port/0", "Port could not be cast to integer value"),
        ("redis:///0", "no host"),
        ("redis://127.0.0.1:6379/zero", "the path must be a database number (/0), not '/zero'"),
    ],
)
def test_a_malformed_url_is_exit_2_with_one_line(url: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--example-db", url, "--max-examples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvspec: {url}: ") and why in err and err.count("\n") == 1


def test_a_refused_connection_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listens on the port: `kvspec check` and `kvspec gate` stop before the run, in one line."""
    url = f"redis://127.0.0.1:{_free_port()}/0"
    assert main(["check", "--example-db", url, "--max-examples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvspec: {url}: cannot use the Redis server: ") and err.count("\n") == 1
    assert main(["gate", "--adapter", "reference", "--example-db", url, "--max-examples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvspec: {url}: cannot use the Redis server: ") and err.count("\n") == 1


def test_the_gate_declares_a_redis_example_database(tmp_path: Path) -> None:
    """[tool.kvspec] example-db: a URL stays a URL (a folder is resolved beside the file); a bad one is refused."""
    config = tmp_path / "kvspec.toml"
    config.write_text('adapters = ["reference"]\nexample-db = "redis://127.0.0.1:6379/3"\n')
    assert load_gate(config).example_db == "redis://127.0.0.1:6379/3"
    config.write_text('adapters = ["reference"]\nexample-db = "examples"\n')
    assert load_gate(config).example_db == tmp_path / "examples"
    config.write_text('adapters = ["reference"]\nexample-db = "ftp://x/0"\n')
    with pytest.raises(ValueError, match="example-db: ftp://x/0: an example database URL is redis://"):
        load_gate(config)
