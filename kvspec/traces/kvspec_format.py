"""kvspec's own trace: the ops an adapter was driven with, what it answered, and what it showed.

Line 1 is the header ``{"kvspec_trace": 1, "adapter", "config", "semantics",
"observation"?}``; then one line per step ``{"step", "op", "outcome", "events",
"observation"?}`` (docs/traces.md). Checking replays the ops through the spec's
LedgerModel and judges each step with the spec's own invariants: the refinement
checks compare the recorded outcome, hits, free capacity and evictions with the
spec's prediction, and where two consecutive observations are recorded the
safety invariants run on the transition between them, exactly as the stateful
suite runs them on a live adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from kvspec.spec import INVARIANTS as SPEC_INVARIANTS
from kvspec.spec import Config, Event, Observation, Op, Outcome, Semantics
from kvspec.spec.block_key import parent_prefix
from kvspec.spec.invariants import KeyMemory, Transition, check_transition
from kvspec.spec.ledger import LedgerModel

from . import values
from .codec import event_from_json, event_to_json, observation_from_json, observation_to_json
from .lines import Line, TraceFormatError, iter_lines, read_lines
from .quality import OrphanCounter, TraceQuality
from .result import Judge, TraceInvariant
from .seen import Pool, Seen
from .trace_delta import Base

TRACE_SCHEMA = 1
DELTA_SCHEMA = 2
"""Version 2: a step may record ``delta`` (the change from the observation before, kvspec/traces/trace_delta.py)
instead of ``observation``; the header says ``snapshot_every`` (K: steps 0, K, 2K, ... are full)."""
DESCRIPTION = "kvspec's own trace"
TRACE_ORDER = "trace_order"

INVARIANTS: tuple[TraceInvariant, ...] = (
    TraceInvariant(TRACE_ORDER, "trace", "Steps are numbered 0, 1, 2, ...: none missing, repeated or out of order."),
    *(TraceInvariant(inv.name, inv.kind, inv.doc) for inv in SPEC_INVARIANTS),
)

# Refinement checks that read only the op, the outcome and the spec's prediction: they run without observations.
OBSERVATION_FREE = frozenset({"predicted_admission", "predicted_prefix_hits"})
REFINEMENT = tuple(inv.name for inv in SPEC_INVARIANTS if inv.kind == "refinement")
"""The checks that compare the recording with the spec's model: a step that breaks one re-synchronises it."""


def recognizes(first: Mapping[str, Any]) -> bool:
    """A kvspec trace starts with its header."""
    return "kvspec_trace" in first


def header_json(
    adapter: str, version: str, config: Config, semantics: Semantics, observation: Observation | None
) -> dict[str, Any]:
    """The first line of a trace: who was driven, on what pool, under which declared semantics."""
    header: dict[str, Any] = {
        "kvspec_trace": TRACE_SCHEMA,
        "adapter": adapter,
        "adapter_version": version,
        "config": config.to_json(),
        "semantics": semantics.to_json(),
    }
    if observation is not None:
        header["observation"] = observation_to_json(observation)
    return header


def step_json(
    step: int, op: Op, outcome: Outcome, events: list[Event], observation: Observation | None
) -> dict[str, Any]:
    """One step: the op, the adapter's outcome, what left the cache, and (optionally) the ledger after it."""
    line: dict[str, Any] = {
        "step": step,
        "op": op.to_json(),
        "outcome": {"status": outcome.status, "hit_tokens": outcome.hit_tokens, "message": outcome.message},
        "events": [event_to_json(e) for e in events],
    }
    if observation is not None:
        line["observation"] = observation_to_json(observation)
    return line


def semantics_from_json(data: Any, line: int) -> Semantics:
    """Semantics from a header; unknown fields are ignored, a value outside the field's type is a format error.

    The allowed values are read off Semantics' own annotations, so a field or an
    eviction order the spec adds is accepted here without a change.
    """
    if not isinstance(data, dict):
        raise TraceFormatError(line, "semantics must be an object")
    hints = get_type_hints(Semantics)
    try:
        fields = {
            name: _semantics_field(f"semantics.{name}", value, hints[name])
            for name, value in data.items()
            if name in Semantics.__dataclass_fields__
        }
        return Semantics(**fields)
    except ValueError as exc:  # SpecError is one: a value of the right type the spec refuses
        raise TraceFormatError(line, str(exc)) from None


_PLAIN: dict[Any, Callable[[str, object], object]] = {
    bool: values.boolean,
    int: values.integer,
    float: values.number,
    str: values.string,
}


def _semantics_field(name: str, value: object, hint: Any) -> Any:
    """``value`` checked against a field's annotation: a Literal's options (a union of Literals is one Literal),
    a plain type, or None when optional."""
    options = get_args(hint)
    choices = _literal_options(hint)
    if choices:
        return values.choice(name, value, choices)
    if value is None and type(None) in options:
        return None
    read = next((_PLAIN[t] for t in (hint, *options) if t in _PLAIN), None)
    return value if read is None else read(name, value)


def _literal_options(hint: Any) -> tuple[Any, ...]:
    """The values a Literal, or a union made only of Literals, allows; () for any other annotation."""
    if get_origin(hint) is Literal:
        return get_args(hint)
    parts = get_args(hint)
    if parts and all(get_origin(part) is Literal for part in parts):
        return tuple(option for part in parts for option in get_args(part))
    return ()


def _outcome(line: Line) -> Outcome:
    data = line.need("outcome")
    if not isinstance(data, dict):
        raise TraceFormatError(line.number, f"outcome must be an object with status ok|refused|invalid, not {data!r}")
    status = line.typed(values.choice, "outcome.status", data.get("status"), allowed=("ok", "refused", "invalid"))
    hit = data.get("hit_tokens")
    if hit is not None:
        hit = line.as_int("outcome.hit_tokens", hit)
    return Outcome(status, hit, line.typed(values.string, "outcome.message", data.get("message", "")))


def check(lines: list[Line], judge: Judge) -> None:
    """Replay a kvspec trace through the spec to its end (with ``judge.first``, to its first violating line)."""
    _check(lines[0], lines[1:], judge)


def check_path(path: Path, judge: Judge) -> None:
    """:func:`check`, reading the trace as a stream: what is kept is the observation before the step
    (and a delta's base), never the lines already replayed. A file whose first line is not a kvspec
    header is read whole, to say what it is as :func:`check` does."""
    lines = iter_lines(path)
    head = next(lines, None)
    if head is None:
        raise TraceFormatError(None, "the file holds no trace lines")
    if not recognizes(head.data):
        whole = read_lines(path)
        judge.reset_lines(whole)
        if not any(recognizes(line.data) for line in whole):
            raise TraceFormatError(None, "nothing in this file is a kvspec record")
        check(whole, judge)
        return
    judge.passed(head)
    _check(head, lines, judge)
    result = judge.result
    if result.violation is None and not result.steps and not result.checked:
        judge.current = None
        raise TraceFormatError(
            None, "nothing in this file is a kvspec record that could be checked: no step was replayed"
        )


def _check(head: Line, steps: Iterable[Line], judge: Judge) -> None:
    """The replay of :func:`check` over the header and the step lines as they come."""
    judge.at(head)
    version = head.data.get("kvspec_trace")
    if type(version) is not int or version not in (TRACE_SCHEMA, DELTA_SCHEMA):
        raise TraceFormatError(head.number, f"not a kvspec trace header (kvspec_trace={version!r})")
    if version == DELTA_SCHEMA:
        head.typed(values.integer, "snapshot_every", head.need("snapshot_every"), minimum=1)
    config = head.typed(values.config, "config", head.need("config"))
    semantics = semantics_from_json(head.need("semantics"), head.number)
    if semantics.granularity != "entry":
        # A pool counted in blocks; the spec's block ledger keeps one slot per block.
        head.typed(values.blocks, "config.capacity", config.capacity)
    result = judge.result
    result.adapter = head.opt(values.string, "adapter") or ""
    result.adapter_version = head.opt(values.string, "adapter_version") or ""
    model = LedgerModel(config, semantics) if semantics.exact else None
    if model is None:
        for inv in SPEC_INVARIANTS:
            if inv.kind == "refinement":
                judge.unknown(inv.name, "the trace's semantics are not declared exact")
    memory = KeyMemory()
    placeholder = Observation(config.capacity, config.capacity, {}, {})
    before = observation_from_json(head.data["observation"], head.number) if "observation" in head.data else None
    base = Base(head.data["observation"]) if before is not None else None
    result.quality = quality = TraceQuality()
    if before is None:
        quality.orphans_unknown("the trace records no observations")
    due = 0  # the step number due next: one past the line's own (after a line out of order, the trace's own)
    for step, line in enumerate(steps):
        judge.at(line)
        number = line.need_int("step")
        order = [] if number == due else [_order_problem(due, number)]
        due = number + 1
        if judge.judge(line, step, {TRACE_ORDER: order}) and judge.first:
            return  # the step count stays that of the steps replayed
        op, outcome = line.typed(values.op, "op", line.need("op")), _outcome(line)
        events = tuple(event_from_json(e, line.number) for e in line.need_list("events"))
        after, base = _observed(line, base, version)
        predicted = model.step(op) if model is not None else None
        result.steps += 1
        result.coverage[f"{op.op}:{outcome.status}"] += 1
        for event in events:
            result.coverage[event.kind] += 1
        observed = before is not None and after is not None
        transition = Transition(
            before=before if before is not None and observed else placeholder,
            op=op,
            outcome=outcome,
            events=events,
            after=after if after is not None and observed else placeholder,
            config=config,
            semantics=semantics,
            memory=memory,
            predicted=predicted,
        )
        if observed:
            results = check_transition(transition)
        else:
            results = {inv.name: inv.check(transition) for inv in SPEC_INVARIANTS if inv.name in OBSERVATION_FREE}
            for inv in SPEC_INVARIANTS:
                if inv.name not in OBSERVATION_FREE:
                    judge.unknown(inv.name, "the trace records no observation before and after a step")
        _measure(quality, line.number, op, outcome, events, before, after, config, semantics)
        if judge.watch is not None:
            judge.watch(Seen(line.number, f"L{line.number}", _pool(after), None, events, op, outcome))
        if judge.judge(line, step, results) and judge.first:
            return
        if model is not None and after is not None and any(results.get(name) for name in REFINEMENT):
            model = _resync(model, after, memory)  # the implementation parted from the spec's model here
        if model is None and semantics.exact:
            _unmodelled(judge)
        judge.passed(line)
        before = after  # the recorded observation, broken or not, is the state the next step starts from


def _resync(model: LedgerModel, after: Observation, memory: KeyMemory) -> LedgerModel | None:
    """After a step that broke a refinement check: the spec's model takes the recorded observation as its state.

    Where its ledger can (``LedgerModel.adopt``, block granularity: the objects, requests and index as
    recorded, by the content the checker learned for their keys), so that the refinement checks after it
    judge what is new and not a consequence of the step. A step that breaks only safety or policy checks
    leaves the model as it is: its prediction held; what the recording says is what broke. A ledger that
    adopts nothing (record and entry granularity) goes on from its own state; one that refuses the
    observation part way is dropped (None): the refinement checks end there.
    """
    try:
        model.adopt(after, memory.content.get, memory.free_order)
    except NotImplementedError:
        return model
    except Exception:  # the ledger may be half taken over: its predictions are no longer the spec's
        return None
    return model


def _unmodelled(judge: Judge) -> None:
    """A step after the spec's model was dropped (:func:`_resync`): each refinement check counts it unjudged."""
    for inv in SPEC_INVARIANTS:
        if inv.kind == "refinement":
            judge.cannot_judge(inv.name, "the spec's model could not take the recorded state after a violation")


def _observed(line: Line, base: Base | None, version: int) -> tuple[Observation | None, Base | None]:
    """The observation a step records, whole or as a delta from the base; the base for the next step."""
    if "observation" in line.data:
        observation = observation_from_json(line.data["observation"], line.number)
        return observation, Base(line.data["observation"])  # a full snapshot: the next delta's base
    if "delta" not in line.data:
        return None, None
    if version < DELTA_SCHEMA:
        raise TraceFormatError(line.number, f"a delta in a version {version} trace (deltas need kvspec_trace 2)")
    if base is None:
        raise TraceFormatError(line.number, "malformed delta: no full observation before it to apply it to")
    return observation_from_json(base.apply(line.data["delta"], line.number), line.number), base


def _pool(after: Observation | None) -> Callable[[], Pool]:
    """A step's pool for a picture: the observation it records after it."""
    return lambda: Pool(after)


def _order_problem(expected: int, got: int) -> str:
    if got > expected:
        return f"step {got} where step {expected} was due: {got - expected} step(s) missing or moved"
    return f"step {got} where step {expected} was due: a step repeated or out of order"


def _measure(
    quality: TraceQuality,
    number: int,
    op: Op,
    outcome: Outcome,
    events: tuple[Event, ...],
    before: Observation | None,
    after: Observation | None,
    config: Config,
    semantics: Semantics,
) -> None:
    """The step's part of the trace's cache quality (kvspec/traces/quality.py)."""
    if op.op == "admit" and outcome.status == "ok" and outcome.hit_tokens is not None:
        quality.lookup(hit=outcome.hit_tokens > 0, prompt_tokens=len(op.tokens), hit_tokens=outcome.hit_tokens)
    hits = {oid: o.hits for oid, o in before.objects.items()} if before is not None else {}
    for event in events:
        if event.kind == "evict":
            quality.evict(event.key, "cached", was_hit=bool(hits.get(event.oid)))
    if after is None or semantics.granularity != "block":
        if after is not None:
            quality.orphans_unknown(f"orphans are counted at block granularity, not {semantics.granularity}")
        return
    was = {o.key for o in before.objects.values()} if before is not None else set()
    keys = [o.key for o in after.objects.values() if o.key is not None]
    for key in keys:
        if key not in was:
            quality.cache(key)
    counter = OrphanCounter()
    for key in keys:
        counter.add(key, parent_prefix(key, config.block_size) if isinstance(key, tuple) else None)
    quality.sample(number, counter)
