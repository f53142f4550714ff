"""A tour of every class of bad input the spec defines: one short case per class, replayed before the random phase.

The random phase draws bad input too, but only where the state allows (an append to a preempted request
needs a preempted request); these cases reach each class in at most three ops, so every run tries every
class the adapter can be given (``spec.ops.bad_input_kinds``) and ``bad_input_rejected`` can read "held".
"""

from __future__ import annotations

from typing import cast

from kvspec.case import Case
from kvspec.spec import Config, Op
from kvspec.spec.ops import BAD_INPUT, Granularity, OpKind, bad_input_kinds

TOUR_CONFIG = Config(capacity=4, block_size=2)
SOURCE = "bad-input-tour"


def _longest(config: Config, granularity: Granularity) -> int:
    """The longest prompt an empty pool holds."""
    if granularity == "entry":
        return config.capacity // config.bytes_per_token
    return config.capacity * config.block_size


def _unknown_request(ops: frozenset[OpKind]) -> Op:
    kind = next(k for k in ("release", "append", "preempt", "resume") if k in ops)
    return Op(cast(OpKind, kind), "ghost", (1,) if kind == "append" else ())


def tour_ops(kind: str, ops: frozenset[OpKind], config: Config, granularity: Granularity) -> list[Op]:
    """The ops that reach bad-input class ``kind`` from an empty pool; the last one is the bad input."""
    live, too_long = Op("admit", "r0", (1, 2, 3)), (0,) * (_longest(config, granularity) + 1)
    preempted = [live, Op("preempt", "r0")]
    tours: dict[str, list[Op]] = {
        "no_request_id": [Op("admit", "", (1,))],
        "admit_existing": [live, Op("admit", "r0", (1,))],
        "empty_prompt": [Op("admit", "r0", ())],
        "negative_token": [Op("admit", "r0", (1, -1))],
        "prompt_larger_than_pool": [Op("admit", "r0", too_long)],
        "unknown_op": [live, Op(cast(OpKind, "defragment"), "r0")],
        "append_not_running": [*preempted, Op("append", "r0", (1,))],
        "append_nothing": [live, Op("append", "r0", ())],
        "append_larger_than_pool": [Op("admit", "r0", (1,)), Op("append", "r0", too_long[1:])],
        "preempt_not_running": [*preempted, Op("preempt", "r0")],
        "preempt_bad_mode": [live, Op("preempt", "r0", mode="swap")],
        "resume_not_preempted": [live, Op("resume", "r0")],
    }
    return tours[kind] if kind in tours else [_unknown_request(ops)]


def bad_input_cases(ops: frozenset[OpKind], granularity: Granularity, config: Config = TOUR_CONFIG) -> list[Case]:
    """One case per class of bad input an adapter with ``ops`` at ``granularity`` can be given."""
    return [
        Case(
            "reference",
            config,
            tour_ops(kind, ops, config, granularity),
            {"goal": f"bad_input:{kind}", "description": BAD_INPUT[kind], "source": SOURCE},
        )
        for kind in bad_input_kinds(ops, granularity)
    ]


__all__ = ["TOUR_CONFIG", "bad_input_cases", "tour_ops"]
