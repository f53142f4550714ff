"""A replay as a grid: cache objects (rows) over ops (columns), and what differs between two replays.

Each cell is the state of one object after one op: ``free`` (not holding capacity),
``held`` (referenced by requests, maybe also cached), ``cached`` (unreferenced, holding a
key), with the tokens it holds where the request tables tell them, whether it left the
cache in that op (``evict``, ``reclaim``), and whether a request took a reference on it
while it was already cached or held (a share: a prefix hit or a sibling). The grid
knows nothing of drawing; :mod:`kvspec.show.draw` draws it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from kvspec.spec import Observation

from .replay import Broken, Run

CellState = Literal["free", "held", "cached"]
Holder = tuple[str, int]  # a request and the position of the object in its table


@dataclass(frozen=True)
class Cell:
    """One object after one op. Invariant: ``holders`` is empty unless ``state`` is held."""

    state: CellState = "free"
    holders: tuple[Holder, ...] = ()
    ref_count: int = 0
    cached: bool = False
    tokens: tuple[int, ...] | None = None  # the object's own tokens (a block's slice, a record's prompt)
    prefix: tuple[int, ...] | None = None  # the whole prefix it stands for: what two implementations compare
    size: int = 1
    left: str | None = None  # "evict" or "reclaim": it left the cache during this op
    shared: bool = False  # a request took a reference on it during this op while it was already cached or held
    note: str | None = None  # what a trace records beside the ledger (a state, a hash, tokens): shown without tokens

    def signature(self) -> tuple[object, ...] | None:
        """What must match between two implementations (object ids differ between them); None for a free cell."""
        if self.state == "free":
            return None
        return (self.state, tuple(sorted(self.holders)), self.ref_count, self.cached, self.prefix, self.size)


@dataclass
class Timeline:
    """One run as a grid: ``cells[row][column]``, a column per op (those after the last answer are None)."""

    label: str
    granularity: str
    block_size: int
    rows: list[Hashable]
    columns: list[str]
    outcomes: list[str | None]
    cells: list[list[Cell | None]]
    free: list[int | None]
    capacity: int
    broken: Broken | None = None
    hot_rows: tuple[int, ...] = ()  # rows the violation names
    hot_free: bool = False  # the violation is about the free count
    differs: set[tuple[int, int]] = field(default_factory=set)  # (row, column) cells the other run does not show
    free_differs: set[int] = field(default_factory=set)  # columns whose free count the other run does not show
    outcome_differs: set[int] = field(default_factory=set)  # columns whose outcome the other run does not show

    def row_label(self, row: int) -> str:
        oid = self.rows[row]
        if isinstance(oid, tuple):  # a record or entry, keyed by its prompt
            return "prompt " + _short(oid)
        name = repr(oid) if len(repr(oid)) <= 12 else "#" + repr(oid)[:8] + "..."  # a hash: its first digits
        return f"block {name}" if self.granularity == "block" else f"object {name}"


def _short(tokens: Sequence[int], limit: int = 6) -> str:
    inner = " ".join(str(t) for t in tokens[:limit])
    return f"[{inner}{' ...' if len(tokens) > limit else ''}]"


def cell_text(cell: Cell) -> str:
    """The words inside a cell: who holds it and its ref count, or cached, and its tokens."""
    if cell.state == "free":
        return cell.left or ""
    tokens = (cell.note or "") if cell.tokens is None else _short(cell.tokens, 4)
    if cell.state == "held":
        who = ",".join(dict.fromkeys(req for req, _ in cell.holders))  # none in a block-event log: it has no requests
        head = f"{who} x{cell.ref_count}".strip() + (" #" if cell.cached else "")
    else:
        head = "cached"
    if cell.size != 1:
        head += f" ({cell.size})"
    return f"{head}\n{tokens}".rstrip()


def _rows(run: Run) -> list[Hashable]:
    """Every object the run showed or named in an event, in the order first seen (numerically when all are ints)."""
    seen: dict[Hashable, None] = {}
    for frame in run.frames:
        for oid in frame.obs.objects:
            seen.setdefault(oid, None)
        for event in frame.events:
            seen.setdefault(event.oid, None)
    return in_order(list(seen))


def in_order(oids: list[Hashable]) -> list[Hashable]:
    """Objects in the order they were first seen, block ids (small integers) in numeric order; hashes stay as seen."""
    if all(isinstance(o, int) and not isinstance(o, bool) and 0 <= o < 2**32 for o in oids):
        return sorted(oids)  # type: ignore[type-var]
    return oids


def _holders(obs: Observation) -> dict[Hashable, list[Holder]]:
    holders: dict[Hashable, list[Holder]] = {}
    for rid, request in obs.requests.items():
        for position, oid in enumerate(request.objects):
            holders.setdefault(oid, []).append((rid, position))
    return holders


def _content(obs: Observation, oid: Hashable, holder: Holder, granularity: str, bs: int) -> tuple[tuple[int, ...], ...]:
    """The object's own tokens and the prefix it stands for, read from the holder's request table."""
    tokens = obs.requests[holder[0]].tokens
    if granularity != "block":
        return tokens, tokens
    i = holder[1]
    return tokens[i * bs : (i + 1) * bs], tokens[: (i + 1) * bs]


def build(run: Run) -> Timeline:
    """The grid of one run, with the rows and the free count the violation names marked hot."""
    granularity, bs = run.semantics.granularity, run.config.block_size
    rows = _rows(run)
    where = {oid: i for i, oid in enumerate(rows)}
    cells: list[list[Cell | None]] = [[None] * len(run.ops) for _ in rows]
    memory: dict[Hashable, tuple[Hashable, tuple[int, ...] | None, tuple[int, ...] | None]] = {}  # oid -> key, content
    previous: Observation | None = None
    for col, frame in enumerate(run.frames):
        obs, holders = frame.obs, _holders(frame.obs)
        left = {e.oid: e.kind for e in frame.events}
        before = _holders(previous) if previous is not None else {}
        for oid, row in where.items():
            view = obs.objects.get(oid)
            if view is None:
                memory.pop(oid, None)
                cells[row][col] = Cell(left=left.get(oid))
                continue
            held = holders.get(oid, [])
            remembered = memory.get(oid)
            if oid in left or (remembered is not None and remembered[0] != view.key):
                remembered = None
            tokens: tuple[int, ...] | None
            prefix: tuple[int, ...] | None
            if held:
                tokens, prefix = _content(obs, oid, held[0], granularity, bs)
            elif remembered is not None:
                tokens, prefix = remembered[1], remembered[2]
            elif isinstance(view.key, tuple) and granularity != "block":
                tokens = prefix = view.key
            else:
                tokens = prefix = None
            memory[oid] = (view.key, tokens, prefix)
            was = previous.objects.get(oid) if previous is not None else None
            newcomers = {req for req, _ in held} - {req for req, _ in before.get(oid, [])}
            shared = (
                bool(newcomers) and was is not None and oid not in left and (was.key is not None or was.ref_count > 0)
            )
            cells[row][col] = Cell(
                "held" if view.ref_count or held else "cached",
                tuple(held),
                view.ref_count,
                view.key is not None,
                tokens,
                prefix,
                view.size,
                left.get(oid),
                shared,
                frame.notes.get(oid),
            )
        previous = obs
    answered = len(run.frames)
    timeline = Timeline(
        run.label,
        granularity,
        bs,
        rows,
        [f"{i}. {op}" for i, op in enumerate(run.ops)],
        [f.outcome.status for f in run.frames] + [None] * (len(run.ops) - answered),
        cells,
        [f.obs.free for f in run.frames] + [None] * (len(run.ops) - answered),
        run.config.capacity,
        run.broken,
    )
    if run.broken is not None:
        text = "\n".join(run.broken.failures.get(run.broken.invariant, []))  # what the named invariant says
        timeline.hot_rows = tuple(i for i, oid in enumerate(rows) if names(text, oid))
        timeline.hot_free = bool(re.search(r"\bfree (capacity|count|\d)", text))
    return timeline


_LISTS = re.compile(r"(?:objects|entries|blocks) ([\[(][^\[\]()]*[\])])")


def names(text: str, oid: Hashable) -> bool:
    """Whether a problem text names object ``oid`` (``object 3``, ``block 3`` but not ``block 3 of r0``: a position,
    ``hash 3`` as the stream checks name a block, or inside ``objects (3, 4)``)."""
    r = re.escape(repr(oid))
    if re.search(rf"\b(?:object|block|hash) {r}(?![\w.])(?! of )", text):
        return True
    return any(repr(oid) in (part.strip() for part in m.group(1)[1:-1].split(",")) for m in _LISTS.finditer(text))


def compare(a: Timeline, b: Timeline) -> None:
    """Mark in each timeline what the other does not show: cells by content (ids differ between implementations),
    free counts and outcomes, column by column where both answered."""
    for col in range(min(len(a.columns), len(b.columns))):
        if a.outcomes[col] is None or b.outcomes[col] is None:
            continue
        if a.free[col] != b.free[col]:
            a.free_differs.add(col)
            b.free_differs.add(col)
        if a.outcomes[col] != b.outcomes[col]:
            a.outcome_differs.add(col)
            b.outcome_differs.add(col)
        _mark(a, b, col)
        _mark(b, a, col)


def _mark(this: Timeline, other: Timeline, col: int) -> None:
    """Mark the cells of ``this`` at ``col`` whose content ``other`` shows fewer times (a multiset difference)."""
    theirs = Counter(c.signature() for row in other.cells if (c := row[col]) is not None)
    theirs.pop(None, None)
    for r, row in enumerate(this.cells):
        cell = row[col]
        sig = None if cell is None else cell.signature()
        if sig is None:
            continue
        if theirs[sig] > 0:
            theirs[sig] -= 1
        else:
            this.differs.add((r, col))


def timelines(runs: Sequence[Run]) -> list[Timeline]:
    """The grids of the runs; two (the spec above the adapter) are compared cell by cell."""
    grids = [build(run) for run in runs]
    if len(grids) == 2:
        compare(grids[0], grids[1])
    return grids


CASE_WINDOW = 40
"""A case longer than this many ops is drawn as a window of them: those up to its first violation, or its last
ones when every invariant held (as a trace's page draws its failing window; a 3,000-op case drawn whole took
minutes). The verdict and its step are the whole case's."""


def case_window(count: int, broken_at: int | None, width: int = CASE_WINDOW) -> tuple[int, int]:
    """The ops ``[start, stop)`` to draw of a case of ``count`` ops that first broke at ``broken_at`` (or held)."""
    if count <= width:
        return 0, count
    stop = count if broken_at is None else min(count, broken_at + 1)
    return max(0, stop - width), stop


def window(grids: Sequence[Timeline], start: int, stop: int) -> list[Timeline]:
    """Columns ``[start, stop)`` of each grid, keeping the rows that hold something there; marks moved along.

    A violation inside the window keeps its true step in its label (``at``)."""
    cut = []
    for g in grids:
        keep = [r for r, row in enumerate(g.cells) if any(c is not None for c in row[start:stop])]
        moved = {r: i for i, r in enumerate(keep)}
        broken = g.broken
        if broken is not None:
            inside = start <= broken.step < stop
            step = broken.step - start if inside else stop - start  # outside: past the last column, not drawn
            broken = replace(broken, step=step, at=broken.at or f"step {broken.step}")
        cut.append(
            replace(
                g,
                rows=[g.rows[r] for r in keep],
                columns=g.columns[start:stop],
                outcomes=g.outcomes[start:stop],
                cells=[g.cells[r][start:stop] for r in keep],
                free=g.free[start:stop],
                broken=broken,
                hot_rows=tuple(moved[r] for r in g.hot_rows if r in moved),
                differs={(moved[r], c - start) for r, c in g.differs if r in moved and start <= c < stop},
                free_differs={c - start for c in g.free_differs if start <= c < stop},
                outcome_differs={c - start for c in g.outcome_differs if start <= c < stop},
            )
        )
    return cut


__all__ = [
    "CASE_WINDOW",
    "Cell",
    "Timeline",
    "build",
    "case_window",
    "cell_text",
    "compare",
    "in_order",
    "names",
    "timelines",
    "window",
]
