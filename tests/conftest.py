"""Shared fixtures. tests/ is on sys.path (pytest rootdir insertion), so seeded_bugs imports directly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kvspec.adapters.isolation import kill_children, live_children
from kvspec.report import Report, report_problems

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def every_report_conforms(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every Report built during a test is valid JSON of the shipped report schema (kvspec/schemas)."""
    built = Report.__init__

    def validated(self: Report, *args: Any, **kwargs: Any) -> None:
        built(self, *args, **kwargs)
        data = json.loads(json.dumps(self.to_json()))
        problems = report_problems(data)
        assert not problems, f"a {self.profile!r} report of {self.adapter!r} breaks the schema: {problems[:5]}"

    monkeypatch.setattr(Report, "__init__", validated)
    yield


@pytest.fixture(autouse=True)
def no_adapter_process_outlives_its_check() -> Iterator[None]:
    """Every isolated adapter a test starts is closed by the code that started it."""
    yield
    leaked = live_children()
    kill_children()
    assert leaked == 0, f"{leaked} adapter process(es) left running"
