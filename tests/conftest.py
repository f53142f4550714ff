"""Shared fixtures. tests/ is on sys.path (pytest rootdir insertion), so seeded_bugs imports directly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

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
