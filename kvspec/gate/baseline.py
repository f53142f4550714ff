"""Known violations a gate lives with: a baseline file, and the fingerprint that recognises a bug again.

A baseline (schema ``kvspec/schemas/baseline.schema.json``, ``kvspec_baseline: 1``) lists
entries, each: ``adapter``, ``invariant``, ``fingerprint``, ``reason``, optionally
``versions`` (a PEP 440 specifier such as ``">=0.10.2,<0.24"`` over the version number in the
adapter's declared version, its last word: ``"vllm 0.23.1"`` is 0.23.1; the entry applies only
to those), and the shrunk ``case`` itself, so that every run can replay it and say whether the
bug is still there (``known``) or gone (``fixed``).

**The fingerprint** of a counterexample is its invariant and the *shape* of its ops up to
the violating step: each op's kind, its request renamed by order of first appearance
(``r0``, ``r1``, ...), the full blocks of its tokens named by their prefix in order of first
appearance (so which blocks are shared shows, their token values do not), its keep and
preemption mode. Shrunk cases of one bug found from different seeds differ in request names,
token values, a partial last block and the pool's size (the shrinker lowers it as far as the
bug allows, from wherever it started), so none of those count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from kvspec import jsonio, schemas
from kvspec.case import Case
from kvspec.spec import Op

BASELINE_SCHEMA = 1
"""Version of the baseline JSON (its ``kvspec_baseline`` key)."""


def fingerprint(invariant: str, ops: Sequence[Op], step: int | None = None, block_size: int = 1) -> str:
    """The fingerprint of a counterexample breaking ``invariant`` at ``step`` (None: its last op) on a pool of
    ``block_size`` tokens per block."""
    requests: dict[str | None, str] = {None: "-"}
    blocks: dict[tuple[int, ...], int] = {}
    shape = [invariant]
    for op in ops[: None if step is None else step + 1]:
        req = requests.setdefault(op.req, f"r{len(requests) - 1}")
        full = len(op.tokens) - len(op.tokens) % block_size
        prefixes = (tuple(op.tokens[:end]) for end in range(block_size, full + 1, block_size))
        names = ".".join(str(blocks.setdefault(p, len(blocks))) for p in prefixes)
        shape.append(f"{op.op}({req};{names};{op.keep:d};{op.mode})")
    return hashlib.sha256("|".join(shape).encode()).hexdigest()[:16]


def case_fingerprint(case: Case) -> str:
    """The fingerprint of a saved case (its ``expected`` names the invariant and the step)."""
    invariant = str(case.expected.get("invariant", ""))
    return fingerprint(invariant, case.ops, case.expected.get("step"), case.config.block_size)


@dataclass(frozen=True)
class Entry:
    """One known violation: where, what, why it is tolerated, and its case."""

    adapter: str
    invariant: str
    fingerprint: str
    reason: str
    case: Case
    versions: str = ""

    def __post_init__(self) -> None:
        try:
            SpecifierSet(self.versions)
        except InvalidSpecifier:
            raise ValueError(f"versions {self.versions!r} is not a version specifier (e.g. '>=0.10.2,<0.24')") from None

    def applies_to(self, adapter: str, version: str) -> bool:
        """Whether this entry speaks of ``adapter`` at ``version`` (every version when no range is given; a
        version that is not a version number falls outside every range)."""
        if self.adapter != adapter:
            return False
        if not self.versions:
            return True
        try:
            return Version((version.split() or [""])[-1]) in SpecifierSet(self.versions)
        except InvalidVersion:
            return False

    def to_json(self) -> dict[str, Any]:
        out = {
            "adapter": self.adapter,
            "invariant": self.invariant,
            "fingerprint": self.fingerprint,
            "reason": self.reason,
            "case": self.case.to_json(),
        }
        return out | ({"versions": self.versions} if self.versions else {})

    @classmethod
    def from_case(cls, case: Case, reason: str, *, adapter: str | None = None, versions: str = "") -> Entry:
        invariant = case.expected.get("invariant")
        if not isinstance(invariant, str) or not invariant:
            raise ValueError("the case names no broken invariant (expected.invariant): it is not a counterexample")
        return cls(adapter or case.adapter, invariant, case_fingerprint(case), reason, case, versions)


@dataclass
class Baseline:
    """The known violations of one repository (an empty baseline when the file does not exist yet)."""

    entries: list[Entry] = field(default_factory=list)

    def for_adapter(self, adapter: str, version: str) -> list[Entry]:
        return [e for e in self.entries if e.applies_to(adapter, version)]

    def add(self, entry: Entry) -> bool:
        """Add ``entry`` unless one of the same adapter and fingerprint is there; whether it was added."""
        if any(e.adapter == entry.adapter and e.fingerprint == entry.fingerprint for e in self.entries):
            return False
        self.entries.append(entry)
        return True

    def to_json(self) -> dict[str, Any]:
        return {"kvspec_baseline": BASELINE_SCHEMA, "entries": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, data: Any) -> Baseline:
        """ValueError (one line, naming the place) when ``data`` is not a baseline."""
        if not isinstance(data, dict) or data.get("kvspec_baseline") != BASELINE_SCHEMA:
            found = data.get("kvspec_baseline") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a kvspec baseline file (kvspec_baseline={found!r})")
        schemas.check(data, "baseline")
        entries = []
        for i, e in enumerate(data["entries"]):
            try:
                case = Case.from_json(e["case"])
            except ValueError as exc:
                raise ValueError(f"entries[{i}].case: {exc}") from None
            try:
                entries.append(
                    Entry(e["adapter"], e["invariant"], e["fingerprint"], e["reason"], case, e.get("versions", ""))
                )
            except ValueError as exc:
                raise ValueError(f"entries[{i}]: {exc}") from None
        return cls(entries)

    @classmethod
    def load(cls, path: Path) -> Baseline:
        """The baseline at ``path``; empty when there is no such file; ValueError when it is not a baseline."""
        if not path.exists():
            return cls()
        return cls.from_json(jsonio.load(path))

    def save(self, path: Path) -> None:
        jsonio.write(path, self.to_json(), indent=1)


__all__ = ["BASELINE_SCHEMA", "Baseline", "Entry", "case_fingerprint", "fingerprint"]
