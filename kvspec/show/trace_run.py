"""A checked trace drawn: the window that ends at its first violation, or the whole trace when it holds.

``kvspec trace check --html`` and a live run's recorded logs come here. The trace is checked by
:func:`kvspec.traces.check_trace` with a watch that keeps what each replayed line leaves
(:class:`~kvspec.traces.Seen`, built by the format's own replay, so what is drawn is what was
judged); the lines become the columns of a :class:`~kvspec.show.replay.Run` and are drawn as any
case is. A kvspec trace of exact semantics gets the spec's replay of its ops above it, compared
cell by cell. A trace longer than a window also gets an overview: every line a pixel column,
every object a row (:func:`kvspec.show.plots.overview_chart`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvspec.case import Case
from kvspec.spec import Config, Event, Observation, Op, Outcome, Semantics
from kvspec.traces import Seen, TraceFormatError, TraceOptions, TraceResult, check_trace
from kvspec.traces.kvspec_format import semantics_from_json
from kvspec.traces.lines import read_lines
from kvspec.traces.seen import FREE, LEAVING, look

from .draw import Picture, draw
from .page import Shown
from .replay import Broken, Frame, Run, on_spec
from .timeline import names, timelines

WINDOW = 16
"""Columns of a failing trace's picture: the violating line and the lines replayed before it."""
MAX_COLUMNS = 40
"""A holding trace of up to this many replayed lines is drawn whole; a longer one as an overview and its last WINDOW."""
MAX_ROWS = 40
"""Objects drawn in a window at most: those the violation names first, then those that change most."""


KEEP = MAX_COLUMNS + 1
"""Lines kept whole (with their pool): the window is always the trace's tail, and one line before it."""

Codes = dict[Hashable, int]
"""Objects' looks on the overview (kvspec.traces.seen: cached, held, leaving; absent: free)."""


@dataclass(frozen=True)
class Shot:
    """One replayed line kept whole: its pool taken when it was replayed."""

    line: int
    label: str
    observation: Observation | None
    events: tuple[Event, ...] = ()
    op: Op | None = None
    outcome: Outcome | None = None
    notes: Mapping[Hashable, str] = field(default_factory=dict)
    capacity_known: bool = True


@dataclass
class TraceCheck:
    """A trace checked, with its last replayed lines kept whole for a picture and every line as what it changed.

    ``seen``: the last :data:`KEEP` lines (a failing check's watch stops at its violating line, so the window is
    always among them); ``total``: every line replayed; ``lines``, ``changes``, ``ops``: per replayed line its
    number, the objects whose look it changed (FREE: gone) and its op, so an overview of a long log costs what
    changed in it, not lines times blocks.
    """

    path: Path
    result: TraceResult
    seen: list[Shot]
    total: int
    lines: list[int]
    changes: list[Codes]
    ops: list[Op | None]


class _Keeper:
    """The watch of one check: every line's changes, and the pools of the lines from ``first`` on (None: none)."""

    def __init__(self, first: int | None) -> None:
        self.first = first
        self.tail: deque[Shot] = deque(maxlen=KEEP)
        self.total = 0
        self.lines: list[int] = []
        self.changes: list[Codes] = []
        self.ops: list[Op | None] = []
        self.last: Codes = {}

    def __call__(self, seen: Seen) -> None:
        wanted = self.first is not None and self.total >= self.first
        self.total += 1
        self.lines.append(seen.line)
        self.ops.append(seen.op)
        pool = seen.pool() if wanted or seen.changed is None else None
        if seen.changed is None:
            objects = pool.observation.objects if pool is not None and pool.observation is not None else {}
            now: Codes = {oid: look(view.ref_count, view.key) for oid, view in objects.items()}
            now.update((event.oid, LEAVING) for event in seen.events)
        else:
            now = {oid: code for oid, code in self.last.items() if code != LEAVING}  # a block that left is free now
            now.update(seen.changed)
        change = {oid: code for oid, code in now.items() if self.last.get(oid, FREE) != code}
        change.update((oid, FREE) for oid in self.last if oid not in now)
        self.changes.append({oid: code for oid, code in change.items() if code != FREE or oid in self.last})
        self.last = {oid: code for oid, code in now.items() if code != FREE}
        if wanted and pool is not None:
            self.tail.append(
                Shot(
                    seen.line,
                    seen.label,
                    pool.observation,
                    seen.events,
                    seen.op,
                    seen.outcome,
                    pool.notes,
                    pool.capacity_known,
                )
            )


def check(
    path: Path, fmt: str, *, context: int = 3, options: TraceOptions | None = None, first: bool = False
) -> TraceCheck:
    """Check the trace as ``kvspec trace check`` does, keeping what a picture of it needs: a first pass keeps what
    each line changed; a second replays it again to take the pools of the last :data:`KEEP` lines only. The watch
    sees the lines up to the first violating one (a check without ``first`` goes on to count the rest unwatched)."""
    counted = _Keeper(None)
    result = check_trace(path, fmt, context=context, options=options, watch=counted, first=first)
    kept = _Keeper(max(counted.total - KEEP, 0))
    if counted.total:
        check_trace(path, fmt, context=context, options=options, watch=kept, first=True)
    return TraceCheck(Path(path), result, list(kept.tail), counted.total, counted.lines, counted.changes, counted.ops)


def _columns(traced: TraceCheck) -> tuple[list[Shot], int | None]:
    """The kept lines to draw and the index of the violating one (a line no replay reached is added after them)."""
    seen, violation = list(traced.seen), traced.result.violation
    if violation is None:
        return seen, None
    at = next((i for i, s in enumerate(seen) if s.line == violation.line), None)
    if at is None:  # broken before its replay ran (the trace's own order): drawn on the pool before it
        at = sum(1 for s in seen if s.line < violation.line)
        before = seen[at - 1].observation if at else None
        seen.insert(at, Shot(violation.line, f"L{violation.line}\n(not replayed)", before))
        del seen[at + 1 :]
    return seen, at


def _window(count: int, at: int | None, total: int) -> tuple[int, int]:
    """The kept columns ``[start, stop)`` drawn cell by cell (``total``: every line replayed)."""
    if at is not None:
        return max(0, at - WINDOW + 1), at + 1
    if total <= MAX_COLUMNS:
        return 0, count
    return count - WINDOW, count


def _rows(seen: Sequence[Shot], start: int, stop: int, named: str) -> set[Hashable]:
    """The objects worth a row in ``seen[start:stop]``: those the violation names, then those whose view changes."""
    changes: dict[Hashable, int] = {}
    previous = seen[start - 1] if start > 0 else None
    for s in seen[start:stop]:
        obs, was = s.observation, previous.observation if previous is not None else None
        now, then = dict(obs.objects) if obs else {}, dict(was.objects) if was else {}
        for oid in {*now, *then, *(e.oid for e in s.events)}:
            notes = (s.notes.get(oid), previous.notes.get(oid) if previous is not None else None)
            if now.get(oid) != then.get(oid) or notes[0] != notes[1] or any(e.oid == oid for e in s.events):
                changes[oid] = changes.get(oid, 0) + 1
        previous = s
    hot = {oid for oid in changes if names(named, oid)}
    rest = sorted((oid for oid in changes if oid not in hot), key=lambda oid: -changes[oid])
    return hot | set(rest[: max(MAX_ROWS - len(hot), 0)])


def _only(obs: Observation | None, keep: set[Hashable], capacity: int) -> Observation:
    """The observation with only the objects that have a row (the free count stays the pool's)."""
    if obs is None:
        return Observation(capacity, capacity, {}, {})
    return Observation(obs.capacity, obs.free, {k: v for k, v in obs.objects.items() if k in keep}, obs.requests)


def _header(path: Path) -> tuple[str, Config, Semantics]:
    """A kvspec trace's adapter, pool and semantics, read by the reader that checked it."""
    from kvspec.traces import values

    head = read_lines(path)[0]
    config = head.typed(values.config, "config", head.need("config"))
    return str(head.data.get("adapter") or ""), config, semantics_from_json(head.need("semantics"), head.number)


def runs(traced: TraceCheck) -> tuple[list[Run], list[str], tuple[int, int]]:
    """The runs to draw (the spec's replay above a kvspec trace of exact semantics), their column labels, and
    which replayed lines ``[start, stop)`` they cover (counted from the trace's first replayed line)."""
    seen, at = _columns(traced)
    start, stop = _window(len(seen), at, traced.total)
    offset = traced.total - len(traced.seen)
    violation = traced.result.violation
    named = "\n".join(violation.failures.get(violation.invariant, violation.problems)) if violation else ""
    keep = _rows(seen, start, stop, named)
    broken = None
    if violation is not None and at is not None:
        broken = Broken(at - start, violation.invariant, dict(violation.failures), f"line {violation.line}")
    labels = [s.label for s in seen[start:stop]]
    window = seen[start:stop]
    name, fmt = traced.path.name, traced.result.fmt
    capacity = max((s.observation.capacity for s in window if s.observation is not None), default=0)
    config, semantics = Config(capacity=max(capacity, 1), block_size=1), Semantics()
    spec: Run | None = None
    if fmt == "kvspec":
        adapter, config, semantics = _header(traced.path)
        if semantics.exact and len(seen) == len(traced.seen) and all(op is not None for op in traced.ops):
            ops = [op for op in traced.ops if op is not None]
            whole = on_spec(Case(adapter or "trace", config, ops), semantics)
            spec = Run(whole.label, config, semantics, list(labels), whole.frames[offset + start : offset + stop])
        labels = [f"{s.label} {s.op.op}\n{s.op.req or ''}" if s.op is not None else s.label for s in window]
        if spec is not None:
            spec.ops = list(labels)
    label = f"{name} ({fmt}): lines {window[0].line}-{window[-1].line}" if window else f"{name} ({fmt})"
    frames = [
        Frame(s.op, s.outcome or Outcome("ok"), s.events, _only(s.observation, keep, config.capacity), dict(s.notes))
        for s in window
    ]
    drawn = Run(label, config, semantics, list(labels), frames, broken)
    recorded = all(s.observation is not None for s in window)
    if not recorded and spec is not None:  # nothing observed: the spec's replay of the ops is all there is to draw
        spec.broken, spec.label = broken, f"{spec.label}: the trace records no observations"
        return [spec], labels, (offset + start, offset + stop)
    drawn.known_capacity = all(s.capacity_known for s in window)
    return ([spec, drawn] if spec is not None else [drawn]), labels, (offset + start, offset + stop)


def verdict(traced: TraceCheck) -> str:
    """One line: the trace's first violation with its line, or that it held."""
    result = traced.result
    if result.error:
        where = f" line {result.error_line}:" if result.error_line is not None else ""
        return f"could not be checked:{where} {result.error}"
    v = result.violation
    if v is None:
        return f"every invariant held on {result.steps} steps ({result.lines} lines, {result.fmt})"
    problems = v.failures.get(v.invariant) or v.problems or ["(no detail)"]
    return f"VIOLATED at line {v.line} ({result.fmt}): {v.invariant}: {problems[0]}"


def picture(traced: TraceCheck, *, prefix: str = "") -> tuple[Picture, list[str], tuple[int, int]]:
    """The window drawn (one panel, or the spec's above the trace's)."""
    drawn, labels, span = runs(traced)
    grids = timelines(drawn)
    for run, grid in zip(drawn, grids, strict=True):
        if not run.known_capacity:
            grid.free = [None] * len(grid.free)
    start, stop = span
    title = f"{traced.path.name}: {stop - start} of {traced.total} replayed lines drawn, {verdict(traced)}"
    return draw(grids, labels, title=title, prefix=prefix), labels, span


def shown(traced: TraceCheck, *, prefix: str = "", name: str = "") -> Shown:
    """The trace as a report page shows it: its window's timeline, and the overview of every line when longer."""
    from .plots import overview_chart

    name = name or str(traced.path)
    if traced.result.error:
        return Shown(name, [], verdict=verdict(traced), problem=f"the trace could not be checked: {verdict(traced)}")
    if not traced.seen:
        return Shown(name, [], verdict=verdict(traced), problem="no line of the trace was replayed")
    try:
        pic, labels, span = picture(traced, prefix=prefix)
    except (OSError, ValueError, TraceFormatError) as exc:
        return Shown(name, [], verdict=verdict(traced), problem=f"the trace could not be drawn: {exc}")
    overview = ""
    if span != (0, traced.total):
        violation = traced.result.violation
        at = None if violation is None else sum(1 for n in traced.lines if n < violation.line)
        overview = overview_chart(traced.lines, traced.changes, span, at, prefix=prefix).svg()
    return Shown(name, labels, pic.svg(), verdict(traced), overview=overview)


__all__ = ["MAX_COLUMNS", "MAX_ROWS", "WINDOW", "TraceCheck", "check", "picture", "runs", "shown", "verdict"]
