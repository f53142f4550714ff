"""vLLM's KV cache events as the live adapter records them: a thin reader over its offline checker.

The log (docs/traces.md, and adapters/vllm_live/recorded.py, which owns the
schema) holds, one record a line: ``{"config": {...}}`` (block size, pool size,
hash recipe), ZMQ batches ``{"seq", "ts", "events": [BlockStored |
BlockRemoved | AllBlocksCleared ...]}``, completed requests ``{"request":
{...}}``, gauge snapshots ``{"metrics": {...}}``, prefix-cache resets
``{"reset": {...}}`` and lost batches ``{"gap": {...}}``; lines of other shapes
are notes and are skipped. This module checks each record's shape and the type
of every field the checker reads with its line number, hands the records to
``check_recorded`` (the stream ledger of spec/stream.py) and maps its verdicts
and first violation back to lines.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.report import SAMPLE_LINES
from kvspec.spec import Event, ObjectView, Observation
from kvspec.spec.stream import STREAM_INVARIANTS, StreamCheck, StreamResult

from . import values
from .lines import Line, TraceFormatError, iter_lines, parse_line, raw_lines
from .result import Judge, Tally, TraceInvariant, TraceResult, TraceViolation
from .seen import CACHED, FREE, LEAVING, Pool, Seen, Watch, short
from .vllm_batch import DECODE

INVARIANTS: tuple[TraceInvariant, ...] = tuple(
    TraceInvariant(name, kind, "see kvspec.spec.stream") for name, kind in STREAM_INVARIANTS
)
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


DESCRIPTION = "vLLM KV cache events as the live adapter records them"


def recognizes(first: Mapping[str, Any]) -> bool:
    """A recorded live run starts with one of its record kinds."""
    return kind_of(first) is not None


def kind_of(data: Mapping[str, Any]) -> str | None:
    """The record kind, in the order check_recorded tells them apart; None for a note."""
    for kind in ("gap", "reset", "config", "request", "metrics"):
        if kind in data:
            return kind
    return "batch" if "seq" in data and "events" in data else None


def _positive(name: str, value: object) -> int:
    return values.integer(name, value, minimum=1)


def _count(name: str, value: object) -> int:
    return values.integer(name, value, minimum=0)


def _integers(name: str, value: object) -> None:
    if type(value) is list and all(type(item) is int for item in value):
        return  # the common case, at C speed (a bool's type is bool, not int)
    for i, item in enumerate(values.array(name, value)):
        values.integer(f"{name}[{i}]", item)


def _hashes(name: str, value: object) -> None:
    if type(value) is list and all(type(key) is int or type(key) is str for key in value):
        return
    for i, key in enumerate(values.array(name, value)):
        values.block_hash(f"{name}[{i}]", key)


def _event(name: str, found: object) -> None:
    event = values.mapping(name, found)
    kind = values.string(f"{name}.type", event.get("type"))
    if kind in ("BlockStored", "BlockRemoved"):
        _hashes(f"{name}.block_hashes", event.get("block_hashes"))
    if kind == "BlockStored":
        _integers(f"{name}.token_ids", event.get("token_ids"))
        if event.get("parent_block_hash") is not None:
            values.block_hash(f"{name}.parent_block_hash", event["parent_block_hash"])
        if event.get("block_size") is not None:
            _positive(f"{name}.block_size", event["block_size"])


def _batch(data: dict[str, Any]) -> None:
    values.integer("seq", data.get("seq"))
    values.number("ts", data.get("ts"))
    for i, event in enumerate(values.array("events", data.get("events"))):
        _event(f"events[{i}]", event)


# The fields of each record kind the checker reads: name -> (reader of values.py, required). An optional
# field may be absent or null. The batch, which nests its events, is read by _batch.
Reader = Callable[[str, object], object]
_FIELDS: dict[str, dict[str, tuple[Reader, bool]]] = {
    "request": {
        "id": (values.string, True),
        "prompt_token_ids": (_integers, True),
        "output_token_ids": (_integers, False),
        "cached_tokens": (_count, False),
        "started": (values.number, True),
        "finished": (values.number, True),
        "mode": (values.string, False),
        "preempted": (values.boolean, False),
    },
    "metrics": {
        "ts": (values.number, True),
        "idle": (values.boolean, False),
        "kv_cache_usage_perc": (values.number, False),
        "num_preemptions_total": (values.number, False),
    },
    "reset": {"ts": (values.number, True), "success": (values.boolean, False)},
    "gap": {"from": (values.integer, True), "to": (values.integer, True)},
    "config": {
        "block_size": (_positive, False),
        "num_gpu_blocks": (values.blocks, False),
        "hash_algo": (values.string, False),
        "none_hash_seed": (values.string, False),
        "events": (values.string, False),
        "vllm": (values.string, False),
        "initial_cache": (lambda name, value: values.choice(name, value, ("empty", "unknown")), False),
        "hashes_recomputable": (values.boolean, False),
    },
}


def _record(kind: str, data: dict[str, Any]) -> None:
    body = values.mapping(kind, data[kind])
    for name, (read, required) in _FIELDS[kind].items():
        if required or body.get(name) is not None:
            read(f"{kind}.{name}", body.get(name))


def validate(line: Line) -> str | None:
    """Check one record's shape and types as the checker will read them; its kind (None: a note, skipped)."""
    kind = kind_of(line.data)
    if kind is not None:
        try:
            if kind == "batch":
                _batch(line.data)
            else:
                _record(kind, line.data)
        except ValueError as exc:
            raise TraceFormatError(line.number, f"malformed {kind} record: {exc}") from None
    return kind


Read = Line | tuple[int, bytes]
"""A line of the second read: parsed (a log checked in memory) or its number and bytes, parsed if a finding needs it."""


def _parsed(item: Read) -> Line:
    return item if isinstance(item, Line) else parse_line(*item)


@dataclass
class _Place:
    """Where a finding points: its line, that line's 0-based position, and the lines before it."""

    line: Line
    position: int
    context: list[Line]


def _context_of(lines: Iterable[Line], number: int, keep: int) -> _Place | None:
    """The line numbered ``number`` with its position and the ``keep`` lines before it (one more read)."""
    before: deque[Line] = deque(maxlen=keep)
    for position, line in enumerate(lines):
        if line.number == number:
            return _Place(line, position, list(before))
        before.append(line)
    return None


class _Located:
    """The lines a stream finding may point at, gathered while the stream is read (never the whole log).

    Batches are kept unparsed (``Read``) and parsed only when a finding names them.
    """

    def __init__(self, lines: Callable[[], Iterable[Line]], kept: list[tuple[Line, str]], keep: int) -> None:
        self._lines, self._kept, self._keep = lines, kept, keep
        # batch index -> (line, position, lines before), for the batches that broke something
        self.batches: dict[int, tuple[Read, int, list[Read]]] = {}
        self.last: tuple[Read, int, list[Read]] | None = None
        self._by_id: dict[str, int] | None = None
        self._by_time: dict[float, int] = {}

    @staticmethod
    def _place(found: tuple[Read, int, list[Read]]) -> _Place:
        line, position, before = found
        return _Place(_parsed(line), position, [_parsed(item) for item in before])

    def place(self, where: Mapping[str, Any]) -> _Place:
        """The n-th batch, a request by id, a snapshot by time; the last line for a gap."""
        if "batch" in where and int(where["batch"]) in self.batches:
            return self._place(self.batches[int(where["batch"])])
        found: Line | None = None
        if "request" in where:
            found = next(
                (
                    line
                    for line, kind in self._kept
                    if kind == "request" and str(line.data["request"].get("id")) == str(where["request"])
                ),
                None,
            )
        elif "metrics" in where:
            found = next(
                (
                    line
                    for line, kind in self._kept
                    if kind == "metrics" and float(line.data["metrics"]["ts"]) == float(where["metrics"])
                ),
                None,
            )
        place = None if found is None else _context_of(self._lines(), found.number, self._keep)
        if place is None:
            assert self.last is not None
            return self._place(self.last)
        return place

    def line_of(self, where: Mapping[str, Any]) -> int:
        """The number of the line :meth:`place` finds for ``where``, without reading the log again."""
        if "batch" in where and int(where["batch"]) in self.batches:
            return _number(self.batches[int(where["batch"])][0])
        if self._by_id is None:  # the first request (snapshot) of each id (time), as place() finds it
            self._by_id, self._by_time = {}, {}
            for line, kind in self._kept:
                if kind == "request":
                    self._by_id.setdefault(str(line.data["request"].get("id")), line.number)
                elif kind == "metrics":
                    self._by_time.setdefault(float(line.data["metrics"]["ts"]), line.number)
        found = None
        if "request" in where:
            found = self._by_id.get(str(where["request"]))
        elif "metrics" in where:
            found = self._by_time.get(float(where["metrics"]))
        if found is not None:
            return found
        assert self.last is not None
        return _number(self.last[0])


def _number(item: Read) -> int:
    return item.number if isinstance(item, Line) else item[0]


FirstRead = Iterable[tuple[str | None, Line | None]]
"""The first read of a log: each line's kind, with the line itself where it is not a batch (and the first batch)."""


def _top_kind() -> Callable[[bytes], str | None] | None:
    """A msgspec decoder of a line's kind alone (its batch events left undecoded); None without msgspec."""
    try:
        import msgspec
    except ImportError:
        return None
    unset = msgspec.UNSET

    fields = ("gap", "reset", "config", "request", "metrics", "seq", "events")
    top_type = msgspec.defstruct("Top", [(name, msgspec.Raw | msgspec.UnsetType, unset) for name in fields])
    decode = msgspec.json.Decoder(top_type).decode

    def kind(chunk: bytes) -> str | None:
        try:
            top = decode(chunk)
        except (msgspec.DecodeError, RecursionError):  # nested too deep for msgspec, too
            return None  # read it whole: the strict reader says what it is
        present = [name for name in fields if getattr(top, name) is not unset]  # in kind_of's order
        if present and present[0] not in ("seq", "events"):
            return present[0]
        return "batch" if present == ["seq", "events"] else None

    return kind


_TOP_KIND = _top_kind()


def _first_read(path: Path) -> FirstRead:
    """Each line's kind; the whole line only where the first read needs it (msgspec skips the batches' events)."""
    first_batch = True
    for number, chunk in raw_lines(path):
        kind = _TOP_KIND(chunk) if _TOP_KIND is not None else None
        if kind == "batch" and not first_batch:
            yield kind, None
            continue
        line = parse_line(number, chunk)
        kind = kind_of(line.data)
        first_batch = first_batch and kind != "batch"
        yield kind, line


def check(lines: list[Line], judge: Judge) -> None:
    """Check a recorded vLLM event log with the stream ledger; the first finding is the reported violation."""
    config = _check_stream(((kind_of(line.data), line) for line in lines), lambda: lines, lambda: lines, judge)
    if judge.watch is not None:  # up to and including the first violation's line, as every format
        result = judge.result
        upto = len(lines) if result.violation is None else lines.index(_line_by_number(lines, result.violation.line))
        _watch(lines[: upto + 1], [kind_of(line.data) for line in lines[: upto + 1]], config, judge.watch)


def check_path(path: Path, judge: Judge) -> None:
    """:func:`check`, reading the log twice as a stream: memory is the live index's, not the log's.

    The first read keeps the records that are not batches (config, requests, gauges, resets, gaps:
    they are placed by time between the batches); the second feeds the batches to the ledger one by one.
    """
    _check_stream(_first_read(path), lambda: raw_lines(path), lambda: iter_lines(path), judge)
    result = judge.result
    if result.violation is None and not result.steps and not result.checked:  # as traces._replay
        raise TraceFormatError(
            None, f"nothing in this file is a {result.fmt} record that could be checked: no step was replayed"
        )


def _check_stream(
    first_read: FirstRead, second_read: Callable[[], Iterable[Read]], lines: Callable[[], Iterable[Line]], judge: Judge
) -> dict[str, Any]:
    """Both reads of the log (see check_path); the log's config.

    The second read feeds the batches: a batch line that the typed decoder (vllm_batch.py) reads goes
    to the ledger as decoded, any other line is parsed and validated the strict way. ``lines``: the
    log's lines parsed, read again only to place a finding on a line that is not a batch.
    """
    try:
        from kvspec.adapters.vllm_live.recorded import first_block_size, split_records, stream_checker
    except ImportError as exc:
        raise TraceFormatError(None, f"the vLLM event checker is not available: {exc}") from exc
    result = judge.result
    kept: list[tuple[Line, str]] = []
    total = batches = 0
    hint: int | None = None
    for kind, line in first_read:
        total += 1
        if kind == "batch":
            batches += 1
            if hint is None and line is not None:
                judge.at(line)
                validate(line)
                hint = first_block_size([line.data])
            continue
        assert line is not None  # the first read keeps every line that is not a batch
        judge.at(line)
        if validate(line) is not None:
            kept.append((line, str(kind)))
    if total == 0:
        raise TraceFormatError(None, "the file holds no trace lines")
    if not kept and not batches:
        raise TraceFormatError(None, f"nothing in this file is a {result.fmt} record")
    result.lines = total
    judge.current = None  # the stream ledger reads the non-batch records as a whole, in time order
    log = split_records(line.data for line, _ in kept)
    try:
        check = stream_checker(log, hint)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise TraceFormatError(None, f"the log cannot be checked: {type(exc).__name__}: {exc}") from exc
    located = _Located(lines, kept, judge.context)
    with _no_cycle_collection():
        _feed(second_read(), check, located, judge)
    judge.current = None
    stream = check.close()
    config = log.config
    result.adapter = "vllm-live"
    result.adapter_version = str(config.get("vllm", ""))
    result.steps = batches + len(log.requests)
    result.checked.update(stream.checked)
    result.coverage.update(stream.seen)
    if "published_hash" not in config and not config.get("hashes_recomputable", True):
        judge.unknown("hash_chain_agrees", "the log says its hashes cannot be recomputed")
    if stream.violations:
        _violations(stream, located, judge)
    return config


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The cyclic garbage collector paused (and restored): the batches' objects make no reference cycles.

    Decoding and the ledger allocate a few containers per block, so the collector's generation-0 passes
    ran every few hundred blocks and its full passes walked the whole live index (about 8% of a check).
    Reference counting still frees every batch as soon as it has been applied.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _feed(second_read: Iterable[Read], check: StreamCheck, located: _Located, judge: Judge) -> None:
    """Feed the second read's batches to ``check``, noting where each batch that broke something lies.

    ``window`` holds the line read last and the ``judge.context`` lines before it (a finding's context).
    """
    ledger_result = check.ledger.result
    violations = ledger_result.violations  # with ``kept``: a batch that a finding may point at changes them
    window: deque[Read] = deque(maxlen=judge.context + 1)
    index = position = 0
    for position, item in enumerate(second_read):
        window.append(item)
        if DECODE is not None and not isinstance(item, Line) and (typed := DECODE(item[1])) is not None:
            judge.current = item[0]
            found = (len(violations), ledger_result.kept)
            check.events(typed.seq, typed.ts, typed.events)
        else:
            line = _parsed(item)
            if kind_of(line.data) != "batch":
                continue
            judge.at(line)
            validate(line)
            found = (len(violations), ledger_result.kept)
            check.batch(line.data)
        if (len(violations), ledger_result.kept) != found:
            located.batches[index] = (item, position, list(window)[:-1])
        index += 1
    if window:
        located.last = (window[-1], position, list(window)[:-1])


def _line_by_number(lines: list[Line], number: int) -> Line:
    return next(line for line in lines if line.number == number)


def _violations(stream: StreamResult, located: _Located, judge: Judge) -> None:
    """The stream's first finding as the trace's violation (with its line); the others' first lines."""
    result = judge.result
    first = stream.violations[0]
    where = _where(first)
    place = located.place(where)
    same = {n: v for n, v in stream.first_violation.items() if _where(v) == where}
    result.violation = TraceViolation(
        str(first["invariant"]),
        place.line.number,
        place.position,
        place.line.data,
        list(first["problems"]),
        [(b.number, b.text) for b in place.context],
        {n: list(same[n]["problems"]) for n in stream.violated if n in same},
    )
    for name in stream.violated:
        if name not in same:
            found = stream.first_violation[name]
            later = located.place(_where(found))
            result.later_violations[name] = {
                "line": later.line.number,
                "step": later.position,
                "event": later.line.data,
                "problems": list(found["problems"])[:5],
                "context": [],
            }
    _tally(stream, located, result)


def _tally(stream: StreamResult, located: _Located, result: TraceResult) -> None:
    """Each violated invariant's places (a batch, a request record, a snapshot: a line each) as its tally."""
    for name in stream.violated:
        lines = list(dict.fromkeys(located.line_of(where) for where in stream.places.get(name, ())))[:SAMPLE_LINES]
        if lines:
            result.tallies[name] = Tally(stream.place_counts[name], lines, lines[-1])


def _watch(lines: list[Line], kinds: list[str | None], config: Mapping[str, Any], watch: Watch) -> None:
    """Each record as a picture's column, over the cache index the batches leave (hash -> cached copies).

    The index is the stream ledger's own view (spec/stream.py): a BlockStored adds a copy of each hash, a
    BlockRemoved takes one away, AllBlocksCleared empties it; nothing says which block id holds a hash or who
    references it. Notes hold each hash's tokens. The pool is vLLM's usable blocks (num_gpu_blocks - 1).
    """
    blocks = config.get("num_gpu_blocks")
    usable = int(blocks) - 1 if blocks else None
    copies: dict[Any, int] = {}
    tokens: dict[Any, str] = {}
    for line, kind in zip(lines, kinds, strict=True):
        if kind in (None, "config"):
            continue
        data = line.data
        left: list[Event] = []
        touched: set[Any] = set()
        cleared = False
        if kind == "batch":
            stored = removed = 0
            for event in data["events"]:
                if event.get("type") == "AllBlocksCleared":
                    left += [Event("reclaim", key, key) for key in copies]
                    copies.clear()
                    cleared = True
                for i, key in enumerate(event.get("block_hashes") or ()):
                    touched.add(key)
                    if event.get("type") == "BlockStored":
                        stored += 1
                        copies[key] = copies.get(key, 0) + 1
                        size = int(event.get("block_size") or config.get("block_size") or 0)
                        own = (event.get("token_ids") or [])[i * size : (i + 1) * size] if size else []
                        tokens[key] = "[" + " ".join(str(t) for t in own[:3]) + (" ...]" if len(own) > 3 else "]")
                    elif event.get("type") == "BlockRemoved":  # of an uncached hash too: drawn where it happened
                        removed += 1
                        left.append(Event("evict", key, key))
                        copies[key] = copies.get(key, 0) - 1
                        if copies[key] <= 0:
                            del copies[key]
            label = f"L{line.number} batch {data['seq']}\n+{stored} -{removed}"
        elif kind == "request":
            request = data["request"]
            cached = request.get("cached_tokens")
            label = f"L{line.number} request\n{short(request['id'], 10)} {cached}/{len(request['prompt_token_ids'])}"
        elif kind == "metrics":
            label = f"L{line.number} metrics\nusage {data['metrics'].get('kv_cache_usage_perc')}"
        else:
            label = f"L{line.number} {kind}"

        def pool() -> Pool:  # the index as it is now: called at once or never
            objects = {key: ObjectView(key, n, 0, 0, key) for key, n in copies.items()}
            size = usable or 0
            observation = Observation(size, max(size - sum(copies.values()), 0), objects, {})
            return Pool(observation, {key: tokens.get(key, "") for key in copies}, usable is not None)

        changed = None if cleared else {key: CACHED if key in copies else FREE for key in touched}
        changed = None if changed is None else {**changed, **{e.oid: LEAVING for e in left}}
        watch(Seen(line.number, label, pool, changed, tuple(left)))


def _where(finding: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in finding.items() if k not in ("invariant", "problems")}
