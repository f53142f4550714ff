"""One assertion's outcome, and a section of them that either ran or was skipped for a stated reason.

Invariant: a section is ``held`` only when it ran and every check in it held; a skipped
section is neither held nor violated, and always carries the reason it did not run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Check:
    """A named comparison of an expected figure with a measured (or independently computed) one."""

    name: str
    held: bool
    expected: Any
    measured: Any
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "held": self.held,
            "expected": self.expected,
            "measured": self.measured,
        }
        if self.detail:
            out["detail"] = self.detail
        return out

    def line(self) -> str:
        mark = "ok  " if self.held else "FAIL"
        tail = f" ({self.detail})" if self.detail else ""
        return f"  {mark} {self.name}: expected {self.expected}, got {self.measured}{tail}"


def compare(name: str, expected: Any, measured: Any, detail: str = "") -> Check:
    """A check that holds when the two figures are equal."""
    return Check(name=name, held=expected == measured, expected=expected, measured=measured, detail=detail)


@dataclass
class Section:
    """The checks of one part of ``kvspec gpu-check``, or the reason it was skipped."""

    name: str
    checks: list[Check] = field(default_factory=list)
    skipped: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return self.skipped is None and all(c.held for c in self.checks)

    @property
    def violated(self) -> bool:
        return any(not c.held for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped, **self.extra}
        return {"held": self.held, **self.extra, "checks": [c.to_json() for c in self.checks]}
