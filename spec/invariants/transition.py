"""One transition of an implementation, and the shape of an invariant: a function over it.

An invariant returns None when it does not apply to the step, otherwise the
list of problems it found (empty: held).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import msgspec

from ..ledger import Step, validate
from ..observation import Observation
from ..ops import Config, Event, Op, Outcome, Semantics, SpecError

if TYPE_CHECKING:
    from .key_memory import KeyMemory

Problems = list[str] | None

ONE_TABLE = frozenset({"one_table"})
"""The layouts of a check that reads a request's blocks as one table in token order (position i holds tokens
i*block_size..): a cache with several KV cache groups is judged on the same property per group instead
(spec.invariants.hybrid)."""
Kind = Literal["safety", "refinement", "policy"]
"""safety: every implementation; refinement: implementations that declare exact semantics; policy: every
implementation, judged against the eviction order and admission rules it declares (exact or not)."""


class Transition(msgspec.Struct, frozen=True, dict=True):
    """One step of an implementation: the ledger before, the op, what it answered and emitted, the ledger after.

    A msgspec Struct, built in C on every checked step (a frozen dataclass sets each field through
    ``object.__setattr__``: a tenth of a checked step's own work). ``dict=True`` only so that what several
    checks read of one transition is worked out once per transition (``bad_input_error``).
    """

    before: Observation
    op: Op
    outcome: Outcome
    events: tuple[Event, ...]
    after: Observation
    config: Config
    semantics: Semantics
    memory: KeyMemory
    predicted: Step | None = None  # the spec's step, where the adapter declares exact semantics
    # None: before and after are the whole state. Otherwise the step came as a delta (spec.delta) and this is
    # (oids, request ids) it touched: before and after iterate only the part the step can have changed
    # (KeptObservation.local), lookups answer from the whole state, and only incremental invariants run.
    touched: tuple[frozenset[Hashable], frozenset[str]] | None = None

    @property
    def bad_input_error(self) -> SpecError | None:
        """The spec's error for the op in the state before it (``validate``); None when the op is valid.
        Worked out once per transition (kept in the instance's ``__dict__``): bad_input_rejected, the admission
        checks and the harness's coverage all ask it."""
        memo = self.__dict__
        if "bad_input_error" not in memo:
            try:
                validate(self.op, self.before, self.config, self.semantics)
                memo["bad_input_error"] = None
            except SpecError as exc:
                memo["bad_input_error"] = exc
        return memo["bad_input_error"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Invariant:
    """A named check over one transition; ``doc`` is the first paragraph of its docstring: what it demands."""

    name: str
    kind: Kind
    check: Callable[[Transition], Problems]
    granularities: frozenset[str] = frozenset({"block", "record", "entry"})  # where it can be judged at all
    layouts: frozenset[str] = frozenset({"one_table", "per_group"})  # Semantics.layout it can judge
    evictions: frozenset[str] | None = None  # the Semantics.eviction orders it can judge; None: any
    # Judged on a delta step's local part (Transition.touched) as well: the check iterates only objects,
    # requests and index entries the step can have changed, and each of them is judged from lookups that
    # answer from the whole state, so on a truthful delta it finds exactly what it finds on the whole state.
    # False: a whole-state check, run every K steps and at the end of a run (docs/design.md).
    incremental: bool = False

    def applies(self, semantics: Semantics) -> bool:
        """Whether this invariant can be judged at all for an implementation declaring ``semantics``."""
        return (
            semantics.granularity in self.granularities
            and semantics.layout in self.layouts
            and (self.evictions is None or semantics.eviction in self.evictions)
        )

    @property
    def doc(self) -> str:
        """The first paragraph of the check's docstring as one line (whitespace collapsed); "" when it has none."""
        return first_paragraph(self.check.__doc__)


def first_paragraph(text: str | None) -> str:
    """The first paragraph of a docstring (up to its first blank line) as one line, its whitespace collapsed."""
    lines: list[str] = []
    for line in (text or "").strip().splitlines():
        if not line.strip():
            break
        lines.append(line)
    return " ".join(" ".join(lines).split())


def bad_input(t: Transition) -> str | None:
    """The spec's error for the step's op in the state before it; None when the op is valid."""
    error = t.bad_input_error
    return None if error is None else str(error)


def eviction_candidates(t: Transition) -> set[Hashable]:
    """Block granularity: cached blocks with ref_count 0 before the step, less those the step's admission hit."""
    left = {e.oid for e in t.events}
    mine = t.after.requests.get(t.op.req or "")
    hit = set(mine.objects) - left if mine is not None and t.op.op in ("admit", "resume") else set()
    return {oid for oid, o in t.before.objects.items() if o.ref_count == 0 and o.key is not None and oid not in hit}
