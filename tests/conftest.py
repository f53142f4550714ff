"""Shared fixtures. tests/ is on sys.path (pytest rootdir insertion), so seeded_bugs imports directly."""

from __future__ import annotations

pytest_plugins = ["pytester"]
