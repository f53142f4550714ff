"""A replayable counterexample: the pool, the op sequence, and what broke where.

Cases are an external contract (schema ``kvspec/schemas/case.schema.json``, version
:data:`CASE_SCHEMA`): ``kvspec check`` and ``kvspec bmc`` save them, ``kvspec replay`` and
``kvspec trace record --ops`` read them, on any adapter. A file that does not conform is
rejected with one line naming the first place that is wrong, before anything runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec import jsonio, schemas
from kvspec.spec import Config, Op

CASE_SCHEMA = 1
"""Version of the case JSON (its ``kvspec_case`` key)."""


@dataclass
class Case:
    """A replayable counterexample: the pool, the ops, and what broke where (``expected``)."""

    adapter: str
    config: Config
    ops: list[Op]
    expected: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "kvspec_case": CASE_SCHEMA,
            "adapter": self.adapter,
            "config": self.config.to_json(),
            "ops": [op.to_json() for op in self.ops],
            "expected": self.expected,
        }

    @classmethod
    def from_json(cls, data: Any) -> Case:
        """The case in ``data``; ValueError (one line, naming the place) when it is not a valid case."""
        if not isinstance(data, dict) or data.get("kvspec_case") != CASE_SCHEMA:
            found = data.get("kvspec_case") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a kvspec case file (kvspec_case={found!r})")
        schemas.check(data, "case")
        return cls(
            adapter=str(data.get("adapter", "")),
            config=Config.from_json(data.get("config", {})),
            ops=[Op.from_json(op) for op in data["ops"]],
            expected=dict(data.get("expected", {})),
        )

    def save(self, directory: Path) -> Path:
        """Write the case under ``directory``, named by adapter, broken invariant and a digest of its content."""
        text = jsonio.dumps(self.to_json(), indent=1)
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        adapter = self.adapter.replace("/", "_").replace(":", "_")
        path = directory / f"{adapter}-{self.expected.get('invariant', 'case')}-{digest}.json"
        jsonio.write_text(path, text)
        return path

    @classmethod
    def load(cls, path: Path) -> Case:
        """The case in the file at ``path``: OSError when unreadable, ValueError (one line) when not a valid case."""
        return cls.from_json(jsonio.load(path))


__all__ = ["CASE_SCHEMA", "Case"]
