"""The block-granularity spec in Z3: a bounded pool's state and its transition relation.

This is ``BlockLedger.step`` for ``Semantics(granularity="block", eviction="lru",
hit_cap=True, reset_requires_idle=True)`` written as a Z3 function from a
symbolic state and a symbolic operation to the successor state, the outcome and
the events. The pool is bounded (``Bounds``): N blocks, R requests named
``r0..r{R-1}``, block size B, token ids ``0..A-1``; a prompt has 1..N*B tokens
and an append 1..``max_append`` tokens. Within those bounds every operation of
the spec is encoded, faithfully:

- the LRU free queue as a dense queue-position array (``pos[s]`` is the slot's
  place in the queue, -1 when it is not queued); released blocks join the tail,
  the tail block of a request first (reversed free order), and the head is
  popped whether it is cached or not (lazy eviction);
- the prefix index: one entry per slot (``klen``/``kbits``: the key's length in
  blocks and its tokens), and ``hashed``: whether the slot itself carries that
  key. In the spec the two always agree; a variant can make them differ.
  ``lost``: the slot keeps its key but the index does not find it (an older
  duplicate under ``duplicate_keys="newest"``; always False under ``unkeyed``);
- the admission chain over the index, the hit cap (one prompt token is always
  computed), the all-or-nothing capacity check that counts cached-free hit
  blocks as leaving the queue, and duplicate-key handling: ``Encoding`` keeps
  ``duplicate_keys="unkeyed"`` (a new full block whose prefix is already indexed
  stays unkeyed), ``NewestEncoding`` ``"newest"`` (the new block takes the index
  entry; the block that had it keeps its key, unreachable). ``"indexed"`` (several
  entries per key, vLLM) is not encoded.

Keys are token content, as in the Python spec: a block's key is its request's
first (i+1)*B tokens, packed into a bit-vector (``Bounds.token_bits`` bits per
token) and compared whole. What is not encoded: the clock, ``last_used`` and
``prompt_len`` (no block-granularity invariant or step reads them), and inputs
outside the bounds (empty prompts, negative token ids, prompts larger than the
pool; those are bad input the Python spec rejects before any state is read).

``Encoding`` is the spec's own allocator. Its decision points are small
methods (``blocks_for``, ``accepts``, ``shared_prefix``, ``queue_after_admission``,
``refused_admission``, ``unindex_popped``, ``hit_keys``, ``displaced_keys``, ``ref_counts_at_free``,
``drops_reference``, ``joins_free_queue``): a subclass that overrides one is a
variant of the allocator (a model of an implementation's change), and bounded
model checking shows which invariant it breaks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import z3

from ..ledger import BlockLedger, LedgerModel
from ..observation import ObjectView, Observation, RequestState, RequestView
from ..ops import Config, DuplicateKeys, Event, Op, Outcome, Semantics

Term = Any
"""A z3 expression (the z3 package carries no type information)."""

ADMIT, APPEND, RELEASE, PREEMPT, RESUME, RESET = range(6)
OP_KINDS: tuple[str, ...] = ("admit", "append", "release", "preempt", "resume", "reset_cache")
ABSENT, RUNNING, PREEMPTED = range(3)
OK, REFUSED, INVALID = range(3)
STATUSES: tuple[str, ...] = ("ok", "refused", "invalid")

SEMANTICS = Semantics(granularity="block", eviction="lru", hit_cap=True, reset_requires_idle=True, exact=True)
"""The semantics ``Encoding`` encodes; the reference paged adapter declares the same."""


MAX_BOUNDS = {"blocks": 32, "requests": 16, "block_size": 16, "alphabet": 16, "max_append": 64}
"""The largest bounds a formal command takes: the Z3 terms and the explicit state space grow exponentially with
them (the committed runs use at most 6 blocks and 3 requests); past these a command is refused (exit 2), not
left to run out of memory."""


@dataclass(frozen=True)
class Bounds:
    """The bounded pool: ``blocks`` (N), ``requests`` (R), ``block_size`` (B), token ids below ``alphabet``.

    ``max_append``: tokens one append may add (default B + 1, so that an append
    can cross two block boundaries). ``arith``: ``bv`` encodes counters as
    signed bit-vectors of ``num_width`` bits (fast); ``int`` as mathematical
    integers.
    """

    blocks: int = 4
    requests: int = 2
    block_size: int = 2
    alphabet: int = 2
    max_append: int = 0
    arith: str = "bv"

    def __post_init__(self) -> None:
        for name, most in MAX_BOUNDS.items():  # each as the command line spells it
            value, flag, least = getattr(self, name), "--" + name.replace("_", "-"), int(name != "max_append")
            if value < least:
                default = " (0: the default)" if name == "max_append" else ""
                raise ValueError(f"{flag} must be at least {least}{default}, not {value}")
            if value > most:
                raise ValueError(f"{flag} must be at most {most} (a bounded model is a small instance), not {value}")
        if self.arith not in ("bv", "int"):
            raise ValueError(f"arith must be 'bv' or 'int', not {self.arith!r}")

    @property
    def max_tokens(self) -> int:
        """The longest request: the whole pool."""
        return self.blocks * self.block_size

    @property
    def append_tokens(self) -> int:
        return self.max_append or self.block_size + 1

    @property
    def token_bits(self) -> int:
        return max(1, (self.alphabet - 1).bit_length())

    @property
    def width(self) -> int:
        """Bits of a token string of ``max_tokens`` tokens."""
        return self.max_tokens * self.token_bits

    @property
    def num_width(self) -> int:
        """Bits of a signed counter: room for twice the longest token count.

        Hit counts are the one counter that grows without bound; they wrap
        around past the width, which no invariant can observe (they are only
        ever compared for equality with themselves).
        """
        return (2 * (self.max_tokens + self.append_tokens + self.blocks + self.requests)).bit_length() + 1

    @property
    def config(self) -> Config:
        return Config(capacity=self.blocks, block_size=self.block_size)

    def req_id(self, index: int) -> str:
        return f"r{index}"

    def to_json(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "requests": self.requests,
            "block_size": self.block_size,
            "alphabet": self.alphabet,
            "max_append": self.append_tokens,
        }


@dataclass(frozen=True)
class SymState:
    """One state of the bounded pool.

    Per slot s < N: ``ref`` count, index entry ``klen``/``kbits`` (0: none),
    ``hashed`` (the slot carries that key), ``lost`` (it does, but no lookup finds
    it: the index entry is another slot's), ``fill`` (tokens held), ``hits``,
    ``pos`` (free-queue position, -1: not queued). Per request r < R: ``st``
    (ABSENT, RUNNING, PREEMPTED), tokens ``tlen``/``tbits``, block-table length
    ``nb`` and table ``tab[r][j]`` (the sentinel N past ``nb``).
    """

    ref: tuple[Term, ...]
    klen: tuple[Term, ...]
    kbits: tuple[Term, ...]
    hashed: tuple[Term, ...]
    lost: tuple[Term, ...]
    fill: tuple[Term, ...]
    hits: tuple[Term, ...]
    pos: tuple[Term, ...]
    st: tuple[Term, ...]
    tlen: tuple[Term, ...]
    tbits: tuple[Term, ...]
    nb: tuple[Term, ...]
    tab: tuple[tuple[Term, ...], ...]

    def terms(self) -> list[Term]:
        out: list[Term] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "tab":
                for row in value:
                    out.extend(row)
            else:
                out.extend(value)
        return out

    def eq(self, other: SymState) -> Term:
        return z3.And(*[a == b for a, b in zip(self.terms(), other.terms(), strict=True)])


@dataclass(frozen=True)
class SymOp:
    """One operation: ``kind`` (ADMIT..RESET), request index, ``keep`` (release), ``n`` tokens packed in ``bits``."""

    kind: Term
    req: Term
    keep: Term
    n: Term
    bits: Term

    def terms(self) -> list[Term]:
        return [self.kind, self.req, self.keep, self.n, self.bits]


@dataclass(frozen=True)
class SymStep:
    """What one operation did: status, hit blocks, evicted and reclaimed slots, and the successor."""

    status: Term
    hit_blocks: Term
    evicted: tuple[Term, ...]
    reclaimed: tuple[Term, ...]
    after: SymState


@dataclass(frozen=True)
class SymTransition:
    """One step of a path: the named invariants are formulas over these."""

    before: SymState
    op: SymOp
    step: SymStep

    @property
    def after(self) -> SymState:
        return self.step.after


def _if(cond: Term, a: Term, b: Term) -> Term:
    """z3.If that keeps terms small when both sides are the same expression."""
    if a is b or (z3.is_expr(a) and z3.is_expr(b) and z3.eq(a, b)):
        return a
    return z3.If(cond, a, b)


class Encoding:
    """The transition relation of one bounded pool: the spec's own allocator.

    A subclass is a variant of it: it overrides one or more of the decision
    points (the methods documented as such), and keeps everything else.
    """

    name: ClassVar[str | None] = None
    """What reports call this encoding: None for the spec's own; a variant's class name unless it sets one."""

    duplicate_keys: ClassVar[DuplicateKeys] = "unkeyed"
    """What a block that becomes full under an indexed key does (Semantics.duplicate_keys): unkeyed or newest."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.__dict__.get("name") or cls.__name__

    def __init__(self, bounds: Bounds) -> None:
        if self.duplicate_keys not in ("unkeyed", "newest"):
            raise ValueError(f"duplicate_keys={self.duplicate_keys!r} is not encoded (unkeyed, newest)")
        self.bounds = bounds
        self._bv = bounds.arith == "bv"

    @property
    def semantics(self) -> Semantics:
        """The Python spec's semantics this encoding follows."""
        return replace(SEMANTICS, duplicate_keys=self.duplicate_keys)

    def entry(self, s: SymState, t: int) -> Term:
        """Slot ``t`` is what a lookup of its key finds: it has an index entry and is not a lost duplicate."""
        return z3.And(s.klen[t] > self.num(0), z3.Not(s.lost[t]))

    # -- numbers and token strings -------------------------------------------------------
    def num(self, value: int) -> Term:
        return z3.BitVecVal(value, self.bounds.num_width) if self._bv else z3.IntVal(value)

    def num_var(self, name: str) -> Term:
        return z3.BitVec(name, self.bounds.num_width) if self._bv else z3.Int(name)

    def count(self, conditions: Sequence[Term]) -> Term:
        """How many of ``conditions`` hold."""
        if not conditions:
            return self.num(0)
        return z3.Sum(*[z3.If(c, self.num(1), self.num(0)) for c in conditions])

    def bits(self, value: int) -> Term:
        return z3.BitVecVal(value, self.bounds.width)

    def bits_var(self, name: str) -> Term:
        return z3.BitVec(name, self.bounds.width)

    def mask(self, tokens: int) -> Term:
        """The bits of the first ``tokens`` tokens."""
        tokens = max(0, min(tokens, self.bounds.max_tokens))
        return self.bits((1 << (tokens * self.bounds.token_bits)) - 1)

    def masked(self, bits: Term, n: Term) -> Term:
        """``bits`` cut to its first ``n`` tokens (``n`` symbolic)."""
        out = bits
        for k in range(self.bounds.max_tokens - 1, -1, -1):
            out = z3.If(n == self.num(k), bits & self.mask(k), out)
        return out

    def shifted(self, bits: Term, n: Term) -> Term:
        """``bits`` moved past the first ``n`` tokens (``n`` symbolic)."""
        out = self.bits(0)
        for k in range(self.bounds.max_tokens - 1, -1, -1):
            out = z3.If(n == self.num(k), bits << (k * self.bounds.token_bits), out)
        return out

    def pack(self, tokens: Sequence[int]) -> int:
        w = self.bounds.token_bits
        return sum(int(t) << (i * w) for i, t in enumerate(tokens))

    def unpack(self, value: int, n: int) -> tuple[int, ...]:
        w = self.bounds.token_bits
        return tuple((value >> (i * w)) & ((1 << w) - 1) for i in range(n))

    def _steps(self) -> range:
        """Enough multiples of B to divide any counter the model holds (token counts up to a pool and an append)."""
        b = self.bounds
        return range(1, (b.max_tokens + b.append_tokens) // b.block_size + 2)

    def floor_div(self, n: Term) -> Term:
        """n // B for 0 <= n, as a sum of comparisons (bit-blasts far better than a divider)."""
        bs = self.bounds.block_size
        return self.count([n >= self.num(i * bs) for i in self._steps()])

    def ceil_div(self, n: Term) -> Term:
        """ceil(n / B) for 0 <= n: blocks that hold ``n`` tokens."""
        bs = self.bounds.block_size
        return self.count([n > self.num((i - 1) * bs) for i in self._steps()])

    def tokens_in_block(self, total: Term, index: Term) -> Term:
        """min(B, total - index * B): tokens that block ``index`` of a request of ``total`` tokens holds."""
        bs = self.num(self.bounds.block_size)
        rest = total - index * bs
        return z3.If(rest >= bs, bs, rest)

    # -- states and operations -------------------------------------------------------------
    def state(self, tag: str) -> SymState:
        """A state of fresh variables named after ``tag``."""
        n_, r_ = range(self.bounds.blocks), range(self.bounds.requests)
        return SymState(
            ref=tuple(self.num_var(f"{tag}.ref{s}") for s in n_),
            klen=tuple(self.num_var(f"{tag}.klen{s}") for s in n_),
            kbits=tuple(self.bits_var(f"{tag}.kbits{s}") for s in n_),
            hashed=tuple(z3.Bool(f"{tag}.hashed{s}") for s in n_),
            lost=tuple(z3.Bool(f"{tag}.lost{s}") for s in n_),
            fill=tuple(self.num_var(f"{tag}.fill{s}") for s in n_),
            hits=tuple(self.num_var(f"{tag}.hits{s}") for s in n_),
            pos=tuple(self.num_var(f"{tag}.pos{s}") for s in n_),
            st=tuple(self.num_var(f"{tag}.st{r}") for r in r_),
            tlen=tuple(self.num_var(f"{tag}.tlen{r}") for r in r_),
            tbits=tuple(self.bits_var(f"{tag}.tbits{r}") for r in r_),
            nb=tuple(self.num_var(f"{tag}.nb{r}") for r in r_),
            tab=tuple(tuple(self.num_var(f"{tag}.tab{r}_{j}") for j in n_) for r in r_),
        )

    def initial(self) -> SymState:
        """An empty pool: every slot free, queued in slot order; no request."""
        n, r_ = self.bounds.blocks, range(self.bounds.requests)
        zero, no = self.num(0), z3.BoolVal(False)
        return SymState(
            ref=(zero,) * n,
            klen=(zero,) * n,
            kbits=(self.bits(0),) * n,
            hashed=(no,) * n,
            lost=(no,) * n,
            fill=(zero,) * n,
            hits=(zero,) * n,
            pos=tuple(self.num(s) for s in range(n)),
            st=tuple(self.num(ABSENT) for _ in r_),
            tlen=tuple(zero for _ in r_),
            tbits=tuple(self.bits(0) for _ in r_),
            nb=tuple(zero for _ in r_),
            tab=tuple((self.num(n),) * n for _ in r_),
        )

    def op(self, tag: str) -> SymOp:
        return SymOp(
            self.num_var(f"{tag}.kind"),
            self.num_var(f"{tag}.req"),
            z3.Bool(f"{tag}.keep"),
            self.num_var(f"{tag}.n"),
            self.bits_var(f"{tag}.bits"),
        )

    def op_domain(self, op: SymOp) -> Term:
        """The operations of the bounded model, in one canonical form each."""
        b = self.bounds
        k, n = op.kind, op.n
        has_tokens = z3.Or(k == self.num(ADMIT), k == self.num(APPEND))
        longest = z3.If(k == self.num(ADMIT), self.num(b.max_tokens), self.num(min(b.append_tokens, b.max_tokens)))
        digits = []
        if b.alphabet < (1 << b.token_bits):
            w, top = b.token_bits, b.alphabet - 1
            for i in range(b.max_tokens):
                digits.append(z3.ULE(z3.Extract(i * w + w - 1, i * w, op.bits), top))
        return z3.And(
            k >= self.num(0),
            k <= self.num(RESET),
            z3.If(
                k == self.num(RESET),
                op.req == self.num(0),
                z3.And(op.req >= self.num(0), op.req < self.num(b.requests)),
            ),
            z3.Or(k == self.num(RELEASE), op.keep),
            z3.If(has_tokens, z3.And(n >= self.num(1), n <= longest), n == self.num(0)),
            op.bits == self.masked(op.bits, n),
            *digits,
        )

    # -- the step function ---------------------------------------------------------------------
    def valid(self, s: SymState, op: SymOp) -> Term:
        """The spec's validate(): False exactly for bad input (whatever a variant accepts)."""
        r = self._of_req(s, op)
        st, tlen = r["st"], r["tlen"]
        cap = self.num(self.bounds.blocks)
        release_ok = st != self.num(ABSENT)
        k = op.kind
        return z3.If(
            k == self.num(ADMIT),
            z3.And(st == self.num(ABSENT), op.n >= self.num(1), self.ceil_div(op.n) <= cap),
            z3.If(
                k == self.num(APPEND),
                z3.And(st == self.num(RUNNING), op.n >= self.num(1), self.ceil_div(tlen + op.n) <= cap),
                z3.If(
                    k == self.num(RELEASE),
                    release_ok,
                    z3.If(
                        k == self.num(PREEMPT),
                        st == self.num(RUNNING),
                        z3.If(k == self.num(RESUME), st == self.num(PREEMPTED), z3.BoolVal(True)),
                    ),
                ),
            ),
        )

    def _of_req(self, s: SymState, op: SymOp) -> dict[str, Any]:
        """The fields of request ``op.req``."""
        R = self.bounds.requests

        def pick(xs: Sequence[Term]) -> Term:
            out = xs[R - 1]
            for r in range(R - 2, -1, -1):
                out = _if(op.req == self.num(r), xs[r], out)
            return out

        return {
            "st": pick(s.st),
            "tlen": pick(s.tlen),
            "tbits": pick(s.tbits),
            "nb": pick(s.nb),
            "tab": tuple(pick([s.tab[r][j] for r in range(R)]) for j in range(self.bounds.blocks)),
        }

    def step(self, s: SymState, op: SymOp) -> SymStep:
        """``BlockLedger.step`` on a symbolic state."""
        N = self.bounds.blocks
        k = op.kind
        r = self._of_req(s, op)
        valid = self.accepts(s, op)
        is_admission = z3.Or(k == self.num(ADMIT), k == self.num(RESUME))
        adm = self._admission(
            s,
            op,
            z3.If(k == self.num(ADMIT), op.n, r["tlen"]),
            z3.If(k == self.num(ADMIT), op.bits, r["tbits"]),
        )
        app = self._append(s, op, r)
        is_release = k == self.num(RELEASE)
        fre = self._free(s, op, r, keep=z3.Or(z3.Not(is_release), op.keep), release=is_release)
        rst = self._reset(s)

        def choose(pick: Any) -> Any:
            return _if(
                is_admission,
                pick(adm),
                _if(k == self.num(APPEND), pick(app), _if(k == self.num(RESET), pick(rst), pick(fre))),
            )

        status = z3.If(valid, choose(lambda b: b.status), self.num(INVALID))
        hit = z3.If(z3.And(valid, is_admission), adm.hit_blocks, self.num(0))
        evicted = tuple(z3.And(valid, choose(lambda b, t=t: b.evicted[t])) for t in range(N))
        reclaimed = tuple(z3.And(valid, choose(lambda b, t=t: b.reclaimed[t])) for t in range(N))
        after = self.merge(
            valid,
            self.merge(
                is_admission,
                adm.after,
                self.merge(k == self.num(APPEND), app.after, self.merge(k == self.num(RESET), rst.after, fre.after)),
            ),
            s,
        )
        return SymStep(status, hit, evicted, reclaimed, after)

    def merge(self, cond: Term, a: SymState, b: SymState) -> SymState:
        """``a`` where ``cond`` holds, else ``b``, field by field."""
        kw: dict[str, Any] = {}
        for f in fields(SymState):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name == "tab":
                kw[f.name] = tuple(
                    tuple(_if(cond, u, v) for u, v in zip(rx, ry, strict=True)) for rx, ry in zip(x, y, strict=True)
                )
            else:
                kw[f.name] = tuple(_if(cond, u, v) for u, v in zip(x, y, strict=True))
        return SymState(**kw)

    def _with_request(self, s: SymState, op: SymOp, **new: Any) -> dict[str, Any]:
        """The request fields of ``s`` with request ``op.req`` replaced by ``new``."""
        out: dict[str, Any] = {}
        for name in ("st", "tlen", "tbits", "nb"):
            out[name] = tuple(_if(op.req == self.num(r), new[name], old) for r, old in enumerate(getattr(s, name)))
        out["tab"] = tuple(
            tuple(_if(op.req == self.num(r), nt, ot) for nt, ot in zip(new["tab"], row, strict=True))
            for r, row in enumerate(s.tab)
        )
        return out

    # -- decision points: a variant of the allocator overrides these ------------------------------
    def blocks_for(self, n: Term) -> Term:
        """Decision point: the blocks a request of ``n`` tokens holds, ceil(n / B) (a partial tail takes one)."""
        return self.ceil_div(n)

    def accepts(self, s: SymState, op: SymOp) -> Term:
        """Decision point: the ops the allocator takes as valid input, exactly ``valid``; the rest change nothing."""
        return self.valid(s, op)

    def shared_prefix(self, chain: Term) -> Term:
        """Decision point: how many blocks of the cached ``chain`` an admission shares by reference: all of them.

        The hit cap applies after; a cached block that is not shared would be copied into a fresh one.
        """
        return chain

    def queue_after_admission(
        self, s: SymState, pos: list[Term], hits: Sequence[Term], queued: Sequence[Term], need: Term
    ) -> list[Term]:
        """Decision point: the free queue after an admission, ``pos``, which the blocks it hit have left.

        ``hits``: the slots it hit; ``queued``: the slots queued before it; ``need``:
        the blocks it popped from the head. A referenced block is never in the free
        queue, so never evicted.
        """
        return pos

    def refused_admission(self, s: SymState, hits: Sequence[Term], pos: Sequence[Term]) -> SymState:
        """Decision point: the state a refused admission leaves: ``s`` itself, all or nothing.

        ``hits``: the slots it would have hit; ``pos``: the free queue without them.
        """
        return s

    def unindex_popped(self, s: SymState, popped: Sequence[Term]) -> tuple[list[Term], list[Term]]:
        """Decision point: the index after the slots ``popped`` left the free queue for reuse.

        A popped slot's entry goes, so the index never names a block that holds other tokens.
        """
        klen = [_if(p, self.num(0), v) for p, v in zip(popped, s.klen, strict=True)]
        kbits = [_if(p, self.bits(0), v) for p, v in zip(popped, s.kbits, strict=True)]
        return klen, kbits

    def hit_keys(
        self, s: SymState, hits: Sequence[Term], queued: Sequence[Term], keys: tuple[list[Term], list[Term], list[Term]]
    ) -> tuple[list[Term], list[Term], list[Term]]:
        """Decision point: the keys (klen, kbits, hashed) after an admission, ``keys``; the blocks it hit keep theirs.

        ``hits``: the slots it hit; ``queued``: the slots queued before it (a hit on a
        cached-free block takes it back from the queue, key and all).
        """
        return keys

    def displaced_keys(
        self, keys: tuple[list[Term], list[Term], list[Term], list[Term]], displaced: Sequence[Term]
    ) -> tuple[list[Term], list[Term], list[Term], list[Term]]:
        """Decision point (newest): the keys (klen, kbits, hashed, lost) after new blocks took the index entries
        of the slots ``displaced``: those keep their key, lost (cached, unreachable), until evicted or reclaimed."""
        klen, kbits, hashed, lost = keys
        return klen, kbits, hashed, [z3.Or(v, d) for v, d in zip(lost, displaced, strict=True)]

    def ref_counts_at_free(self, s: SymState, nb: Term, row: Sequence[Term]) -> list[Term]:
        """Decision point: the ref counts a release or preemption starts from: the slots' own.

        ``nb`` and ``row``: the freed request's block-table length and table.
        """
        return list(s.ref)

    def drops_reference(self, entry: Term, ref: Term) -> Term:
        """Decision point: whether a block-table ``entry`` of the freed request drops its reference: always.

        ``ref``: the slot's ref count when the free began. Keeps each ref count equal to the table entries naming it.
        """
        return entry

    def joins_free_queue(self, freed: Term, reclaimed: Term) -> Term:
        """Decision point: whether a ``freed`` block (ref_count 0, not queued) joins the free queue's tail: always.

        Whether its key was ``reclaimed`` by this free or not: every unreferenced block stays allocatable.
        """
        return freed

    def _new_keys(
        self,
        klen1: Sequence[Term],
        kbits1: Sequence[Term],
        lost1: Sequence[Term],
        carried: Sequence[Term],
        pref: Sequence[Term],
        at: Sequence[Sequence[Term]],
        wanted: Sequence[Term],
    ) -> tuple[list[Term], list[Term], list[Term], list[Term]]:
        """Key block i (held by the slot ``at[i]``) where ``wanted[i]``: (klen, kbits, assigned, displaced) after.

        unkeyed: only if its prefix is not indexed yet, by a slot that still ``carried``
        its key (a stale entry of a variant does not count). newest: always;
        ``displaced`` names the slots whose index entry a new block took (see ``displaced_keys``).
        """
        N = self.bounds.blocks
        klen, kbits = list(klen1), list(kbits1)
        assigned, displaced = [z3.BoolVal(False)] * N, [z3.BoolVal(False)] * N
        for i in range(N - 1, -1, -1):
            owner = [
                z3.And(klen1[t] == self.num(i + 1), kbits1[t] == pref[i], z3.Not(lost1[t]), carried[t])
                for t in range(N)
            ]
            key_it = wanted[i] if self.duplicate_keys == "newest" else z3.And(wanted[i], z3.Not(z3.Or(*owner)))
            for t in range(N):
                here = z3.And(at[i][t], key_it)
                klen[t] = z3.If(here, self.num(i + 1), klen[t])
                kbits[t] = z3.If(here, pref[i], kbits[t])
                assigned[t] = z3.Or(assigned[t], here)
                if self.duplicate_keys == "newest":
                    displaced[t] = z3.Or(displaced[t], z3.And(key_it, owner[t], z3.Not(at[i][t])))
        return klen, kbits, assigned, displaced

    def _admission(self, s: SymState, op: SymOp, tl: Term, tb: Term) -> SymStep:
        """``BlockLedger._admission``: hit the cached chain (capped), pop the rest from the queue head."""
        N, B = self.bounds.blocks, self.bounds.block_size
        n_ = range(N)
        full = self.floor_div(tl)
        pref = [tb & self.mask((i + 1) * B) for i in n_]
        match = [
            [z3.And(s.klen[t] == self.num(i + 1), s.kbits[t] == pref[i], z3.Not(s.lost[t])) for t in n_] for i in n_
        ]
        run, hb = z3.BoolVal(True), self.num(0)
        for i in n_:
            run = z3.And(run, self.num(i) < full, z3.Or(*match[i]))
            hb = hb + z3.If(run, self.num(1), self.num(0))
        hb = self.shared_prefix(hb)
        cap = self.floor_div(tl - self.num(1))
        hb = z3.If(hb < cap, hb, cap)
        need = self.blocks_for(tl) - hb
        inq = [p >= self.num(0) for p in s.pos]
        qlen = self.count(inq)
        ishit = [z3.Or(*[z3.And(self.num(i) < hb, match[i][t]) for i in n_]) for t in n_]
        leaving = self.count([z3.And(ishit[t], inq[t]) for t in n_])
        fits = need + leaving <= qlen
        pos1 = [
            z3.If(
                z3.And(inq[t], z3.Not(ishit[t])),
                s.pos[t] - self.count([z3.And(ishit[x], inq[x], s.pos[x] < s.pos[t]) for x in n_]),
                self.num(-1),
            )
            for t in n_
        ]
        popped = [z3.And(pos1[t] >= self.num(0), pos1[t] < need) for t in n_]
        remaining = [z3.If(pos1[t] >= need, pos1[t] - need, self.num(-1)) for t in n_]
        pos2 = self.queue_after_admission(s, remaining, ishit, inq, need)
        klen1, kbits1 = self.unindex_popped(s, popped)
        lost1 = [z3.And(s.lost[t], z3.Not(popped[t])) for t in n_]
        at = [[z3.And(popped[t], pos1[t] == self.num(i) - hb) for t in n_] for i in n_]
        wanted = [z3.And(self.num(i) >= hb, self.num(i) < full) for i in n_]
        carried = [z3.And(s.hashed[t], z3.Not(popped[t])) for t in n_]
        klen, kbits, assigned, displaced = self._new_keys(klen1, kbits1, lost1, carried, pref, at, wanted)
        hashed = [z3.If(popped[t], assigned[t], s.hashed[t]) for t in n_]
        klen, kbits, hashed, lost = self.displaced_keys((klen, kbits, hashed, lost1), displaced)
        klen, kbits, hashed = self.hit_keys(s, ishit, inq, (klen, kbits, hashed))
        nbn = hb + need
        sentinel = self.num(N)
        tab = []
        for j in n_:
            hit_slot, new_slot = sentinel, sentinel
            for t in range(N - 1, -1, -1):
                hit_slot = z3.If(match[j][t], self.num(t), hit_slot)
                new_slot = z3.If(at[j][t], self.num(t), new_slot)
            tab.append(z3.If(self.num(j) < hb, hit_slot, z3.If(self.num(j) < nbn, new_slot, sentinel)))
        one, zero = self.num(1), self.num(0)
        ok_state = SymState(
            ref=tuple(z3.If(popped[t], one, s.ref[t] + z3.If(ishit[t], one, zero)) for t in n_),
            klen=tuple(klen),
            kbits=tuple(kbits),
            hashed=tuple(hashed),
            lost=tuple(lost),
            fill=tuple(
                z3.If(
                    popped[t],
                    self.tokens_in_block(tl, hb + pos1[t]),
                    z3.If(ishit[t], self.tokens_in_block(tl, s.klen[t] - one), s.fill[t]),
                )
                for t in n_
            ),
            hits=tuple(z3.If(popped[t], zero, s.hits[t] + z3.If(ishit[t], one, zero)) for t in n_),
            pos=tuple(pos2),
            **self._with_request(s, op, st=self.num(RUNNING), tlen=tl, tbits=tb, nb=nbn, tab=tab),
        )
        refused_state = self.refused_admission(s, ishit, pos1)
        return SymStep(
            z3.If(fits, self.num(OK), self.num(REFUSED)),
            hb,
            tuple(z3.And(fits, popped[t], s.hashed[t]) for t in n_),
            (z3.BoolVal(False),) * N,
            self.merge(fits, ok_state, refused_state),
        )

    def _append(self, s: SymState, op: SymOp, r: Mapping[str, Any]) -> SymStep:
        """``BlockLedger._append``: pop the blocks past the tail; key the blocks that became full."""
        N, B = self.bounds.blocks, self.bounds.block_size
        n_ = range(N)
        tlen, nb, row = r["tlen"], r["nb"], r["tab"]
        total = tlen + op.n
        bits = r["tbits"] | self.shifted(op.bits, tlen)
        need = self.blocks_for(total) - nb
        need = z3.If(need > self.num(0), need, self.num(0))
        inq = [p >= self.num(0) for p in s.pos]
        fits = need <= self.count(inq)
        popped = [z3.And(inq[t], s.pos[t] < need) for t in n_]
        pos = tuple(z3.If(z3.And(inq[t], s.pos[t] >= need), s.pos[t] - need, self.num(-1)) for t in n_)
        klen1, kbits1 = self.unindex_popped(s, popped)
        lost1 = [z3.And(s.lost[t], z3.Not(popped[t])) for t in n_]
        nbn = nb + need
        pref = [bits & self.mask((i + 1) * B) for i in n_]
        at = [
            [
                z3.Or(
                    z3.And(self.num(i) < nb, row[i] == self.num(t)),
                    z3.And(self.num(i) >= nb, popped[t], s.pos[t] == self.num(i) - nb),
                )
                for t in n_
            ]
            for i in n_
        ]
        old_full, new_full = self.floor_div(tlen), self.floor_div(total)
        wanted = [z3.And(self.num(i) >= old_full, self.num(i) < new_full, self.num(i) < nbn) for i in n_]
        carried = [z3.And(s.hashed[t], z3.Not(popped[t])) for t in n_]
        klen, kbits, assigned, displaced = self._new_keys(klen1, kbits1, lost1, carried, pref, at, wanted)
        hashed = [z3.Or(assigned[t], carried[t]) for t in n_]
        klen, kbits, hashed, lost = self.displaced_keys((klen, kbits, hashed, lost1), displaced)
        sentinel = self.num(N)
        tab = []
        for j in n_:
            new_slot = sentinel
            for t in range(N - 1, -1, -1):
                new_slot = z3.If(z3.And(popped[t], s.pos[t] == self.num(j) - nb), self.num(t), new_slot)
            tab.append(z3.If(self.num(j) < nb, row[j], z3.If(self.num(j) < nbn, new_slot, sentinel)))
        fill = []
        for t in n_:
            value = z3.If(popped[t], self.num(0), s.fill[t])
            for i in range(N - 1, -1, -1):
                value = z3.If(z3.And(at[i][t], self.num(i) < nbn), self.tokens_in_block(total, self.num(i)), value)
            fill.append(value)
        one, zero = self.num(1), self.num(0)
        ok_state = SymState(
            ref=tuple(z3.If(popped[t], one, s.ref[t]) for t in n_),
            klen=tuple(klen),
            kbits=tuple(kbits),
            hashed=tuple(hashed),
            lost=tuple(lost),
            fill=tuple(fill),
            hits=tuple(z3.If(popped[t], zero, s.hits[t]) for t in n_),
            pos=pos,
            **self._with_request(s, op, st=r["st"], tlen=total, tbits=bits, nb=nbn, tab=tab),
        )
        return SymStep(
            z3.If(fits, self.num(OK), self.num(REFUSED)),
            zero,
            tuple(z3.And(fits, popped[t], s.hashed[t]) for t in n_),
            (z3.BoolVal(False),) * N,
            self.merge(fits, ok_state, s),
        )

    def _free(self, s: SymState, op: SymOp, r: Mapping[str, Any], *, keep: Term, release: Term) -> SymStep:
        """``BlockLedger._drop_references``: tail block first; a block at ref_count 0 joins the queue's tail; kept,
        a full block no other block holds the key of takes it."""
        N = self.bounds.blocks
        n_ = range(N)
        nb, row = r["nb"], r["tab"]
        one, zero = self.num(1), self.num(0)
        klen, kbits = list(s.klen), list(s.kbits)
        hashed, lost, fill, hits, pos = list(s.hashed), list(s.lost), list(s.fill), list(s.hits), list(s.pos)
        qlen = self.count([p >= zero for p in s.pos])
        reclaimed = [z3.BoolVal(False)] * N
        start = self.ref_counts_at_free(s, nb, row)
        ref = list(start)
        B = self.bounds.block_size
        for j in range(N - 1, -1, -1):
            held = self.num(j) < nb
            pref = r["tbits"] & self.mask((j + 1) * B)
            # A kept full block that holds no key takes its key if no other block holds it: the last copy of
            # what the request computed stays cached (an unkeyed duplicate whose owner was evicted meanwhile).
            orphaned = z3.And(
                keep,
                self.num((j + 1) * B) <= r["tlen"],
                z3.Not(
                    z3.Or(
                        *[z3.And(hashed[u], klen[u] == self.num(j + 1), kbits[u] == pref, z3.Not(lost[u])) for u in n_]
                    )
                ),
            )
            enqueued = []
            for t in n_:
                drop = self.drops_reference(z3.And(held, row[j] == self.num(t)), start[t])
                zeroed = z3.And(drop, ref[t] - one == zero)
                reclaim = z3.And(zeroed, hashed[t], z3.Not(keep))
                keyed = z3.And(zeroed, orphaned, z3.Not(hashed[t]))
                ref[t] = z3.If(drop, ref[t] - one, ref[t])
                klen[t] = z3.If(reclaim, zero, z3.If(keyed, self.num(j + 1), klen[t]))
                kbits[t] = z3.If(reclaim, self.bits(0), z3.If(keyed, pref, kbits[t]))
                hashed[t] = z3.Or(z3.And(hashed[t], z3.Not(reclaim)), keyed)
                lost[t] = z3.And(lost[t], z3.Not(reclaim))
                reclaimed[t] = z3.Or(reclaimed[t], reclaim)
                wipe = z3.And(zeroed, z3.Not(hashed[t]))
                fill[t] = z3.If(wipe, zero, fill[t])
                hits[t] = z3.If(wipe, zero, hits[t])
                enqueue = self.joins_free_queue(z3.And(zeroed, pos[t] < zero), reclaim)
                pos[t] = z3.If(enqueue, qlen, pos[t])
                enqueued.append(enqueue)
            qlen = qlen + self.count(enqueued)
        sentinel = self.num(N)
        after = SymState(
            ref=tuple(ref),
            klen=tuple(klen),
            kbits=tuple(kbits),
            hashed=tuple(hashed),
            lost=tuple(lost),
            fill=tuple(fill),
            hits=tuple(hits),
            pos=tuple(pos),
            **self._with_request(
                s,
                op,
                st=z3.If(release, self.num(ABSENT), self.num(PREEMPTED)),
                tlen=z3.If(release, zero, r["tlen"]),
                tbits=z3.If(release, self.bits(0), r["tbits"]),
                nb=zero,
                tab=(sentinel,) * N,
            ),
        )
        return SymStep(self.num(OK), zero, (z3.BoolVal(False),) * N, tuple(reclaimed), after)

    def _reset(self, s: SymState) -> SymStep:
        """``BlockLedger._reset_cache``: refused while any block is referenced; else reclaim every cached block."""
        N = self.bounds.blocks
        zero = self.num(0)
        idle = z3.And(*[v == zero for v in s.ref])
        reclaim = [z3.And(idle, s.hashed[t], s.ref[t] == zero) for t in range(N)]
        after = SymState(
            ref=s.ref,
            klen=tuple(z3.If(reclaim[t], zero, s.klen[t]) for t in range(N)),
            kbits=tuple(z3.If(reclaim[t], self.bits(0), s.kbits[t]) for t in range(N)),
            hashed=tuple(z3.And(s.hashed[t], z3.Not(reclaim[t])) for t in range(N)),
            lost=tuple(z3.And(s.lost[t], z3.Not(reclaim[t])) for t in range(N)),
            fill=tuple(z3.If(reclaim[t], zero, s.fill[t]) for t in range(N)),
            hits=tuple(z3.If(reclaim[t], zero, s.hits[t]) for t in range(N)),
            pos=s.pos,
            st=s.st,
            tlen=s.tlen,
            tbits=s.tbits,
            nb=s.nb,
            tab=s.tab,
        )
        return SymStep(
            z3.If(idle, self.num(OK), self.num(REFUSED)),
            zero,
            (z3.BoolVal(False),) * N,
            tuple(reclaim),
            after,
        )

    # -- paths -------------------------------------------------------------------------------------
    def transition(self, before: SymState, op: SymOp, after: SymState) -> tuple[Term, SymTransition]:
        """The relation T(before, op, after) and the transition the invariants read."""
        step = self.step(before, op)
        constraint = z3.And(self.op_domain(op), after.eq(step.after))
        return constraint, SymTransition(
            before, op, SymStep(step.status, step.hit_blocks, step.evicted, step.reclaimed, after)
        )

    # -- between Python and Z3 ---------------------------------------------------------------------
    def value(self, model: z3.ModelRef, term: Term) -> int:
        """A counter's value in ``model`` (bit-vector counters are signed)."""
        v = model.eval(term, model_completion=True)
        return int(v.as_signed_long()) if z3.is_bv_value(v) else int(v.as_long())

    def bits_value(self, model: z3.ModelRef, term: Term) -> int:
        """A token string's packed value in ``model``."""
        return int(model.eval(term, model_completion=True).as_long())

    def decode_op(self, model: z3.ModelRef, op: SymOp) -> Op:
        """The concrete spec Op a model picked."""
        kind = OP_KINDS[self.value(model, op.kind)]
        if kind == "reset_cache":
            return Op("reset_cache")
        req = self.bounds.req_id(self.value(model, op.req))
        if kind in ("admit", "append"):
            n = self.value(model, op.n)
            return Op(kind, req, self.unpack(self.bits_value(model, op.bits), n))  # type: ignore[arg-type]
        if kind == "release":
            return Op("release", req, keep=bool(z3.is_true(model.eval(op.keep, model_completion=True))))
        return Op(kind, req)  # type: ignore[arg-type]

    def key(self, model: z3.ModelRef, s: SymState, t: int) -> tuple[int, ...]:
        """The token content of slot ``t``'s index entry (empty: none)."""
        blocks = self.value(model, s.klen[t])
        return self.unpack(self.bits_value(model, s.kbits[t]), blocks * self.bounds.block_size)

    def observation(self, model: z3.ModelRef, s: SymState) -> Observation:
        """The state as an adapter would report it: the projection the named invariants read."""
        b = self.bounds
        objects: dict[object, ObjectView] = {}
        free = 0
        index: dict[object, tuple[object, ...]] = {}
        for t in range(b.blocks):
            ref, hashed = self.value(model, s.ref[t]), z3.is_true(model.eval(s.hashed[t], model_completion=True))
            key = self.key(model, s, t) if self.value(model, s.klen[t]) > 0 else None
            if key is not None and not z3.is_true(model.eval(s.lost[t], model_completion=True)):
                index[key] = (t,)
            if ref or hashed:
                fill, hits = self.value(model, s.fill[t]), self.value(model, s.hits[t])
                objects[t] = ObjectView(t, 1, fill, ref, key if hashed else None, hits)
            if self.value(model, s.pos[t]) >= 0 and not hashed:
                free += 1
        requests = {}
        for r in range(b.requests):
            st = self.value(model, s.st[r])
            if st == ABSENT:
                continue
            tokens = self.unpack(self.bits_value(model, s.tbits[r]), self.value(model, s.tlen[r]))
            table = tuple(self.value(model, s.tab[r][j]) for j in range(self.value(model, s.nb[r])))
            state: RequestState = "running" if st == RUNNING else "preempted"
            requests[b.req_id(r)] = RequestView(b.req_id(r), tokens, len(tokens), table, state)
        return Observation(b.blocks, free, objects, requests, index)

    def outcome(self, model: z3.ModelRef, tr: SymTransition) -> tuple[Outcome, tuple[Event, ...]]:
        """The outcome and the events of one transition, as an adapter would report them."""
        status = STATUSES[self.value(model, tr.step.status)]
        kind = self.value(model, tr.op.kind)
        hit = self.value(model, tr.step.hit_blocks) * self.bounds.block_size if kind in (ADMIT, RESUME) else None
        outcome = Outcome(status, hit if status == "ok" else None)  # type: ignore[arg-type]
        events = []
        for name, flags in (("evict", tr.step.evicted), ("reclaim", tr.step.reclaimed)):
            for t, flag in enumerate(flags):
                if z3.is_true(model.eval(flag, model_completion=True)):
                    events.append(Event(name, t, self.key(model, tr.before, t)))  # type: ignore[arg-type]
        return outcome, tuple(events)

    def encode_op(self, op: Op) -> SymOp:
        """A concrete Op of the bounded model as constant terms."""
        if op.op not in OP_KINDS:
            raise ValueError(f"unknown op {op.op!r}")
        kind = OP_KINDS.index(op.op)
        req = 0 if op.req is None else self.request_index(op.req)
        if len(op.tokens) > self.bounds.max_tokens or any(not 0 <= t < self.bounds.alphabet for t in op.tokens):
            raise ValueError(f"{op} is outside the bounded model {self.bounds}")
        tokens = op.tokens if op.op in ("admit", "append") else ()
        return SymOp(
            self.num(kind),
            self.num(req),
            z3.BoolVal(op.keep or op.op != "release"),
            self.num(len(tokens)),
            self.bits(self.pack(tokens)),
        )

    def request_index(self, rid: str) -> int:
        if not rid.startswith("r") or not rid[1:].isdigit() or int(rid[1:]) >= self.bounds.requests:
            raise ValueError(f"request {rid!r} is not one of r0..r{self.bounds.requests - 1}")
        return int(rid[1:])

    def encode_model(self, model: LedgerModel) -> SymState:
        """The Python spec's state as constant terms (it must be within the bounds)."""
        b = self.bounds
        if model.config != b.config or not isinstance(model, BlockLedger):
            raise ValueError("the model's pool is not this encoding's")
        if model.semantics.duplicate_keys != self.duplicate_keys:
            raise ValueError(
                f"the model keeps duplicate_keys={model.semantics.duplicate_keys!r}, not {self.duplicate_keys!r}"
            )
        bs = b.block_size
        indexed = {sid: key for key, sid in model.index.items()}
        queue = {sid: i for i, sid in enumerate(model.free_queue)}
        ref, klen, kbits, hashed, lost, fill, hits, pos = [], [], [], [], [], [], [], []
        for sid, slot in enumerate(model.slots):
            entry = indexed.get(sid)
            if entry is not None and entry != slot.key:
                raise ValueError(f"slot {sid} is indexed as {entry!r} but carries {slot.key!r}")
            if slot.key is not None and entry is None and self.duplicate_keys != "newest":
                raise ValueError(f"slot {sid} carries key {slot.key!r} the index does not hold")
            key = () if slot.key is None else tuple(slot.key)  # the prefix a chained key stands for
            ref.append(self.num(slot.ref_count))
            klen.append(self.num(len(key) // bs))
            kbits.append(self.bits(self.pack(key)))
            hashed.append(z3.BoolVal(slot.key is not None))
            lost.append(z3.BoolVal(slot.key is not None and entry is None))
            fill.append(self.num(slot.tokens))
            hits.append(self.num(slot.hits))
            pos.append(self.num(queue.get(sid, -1)))
        st, tlen, tbits, nb, tab = [], [], [], [], []
        for i in range(b.requests):
            req = model.requests.get(b.req_id(i))
            if req is None:
                st.append(self.num(ABSENT))
                tlen.append(self.num(0))
                tbits.append(self.bits(0))
                nb.append(self.num(0))
                tab.append((self.num(b.blocks),) * b.blocks)
                continue
            st.append(self.num(RUNNING if req.state == "running" else PREEMPTED))
            tlen.append(self.num(len(req.tokens)))
            tbits.append(self.bits(self.pack(req.tokens)))
            nb.append(self.num(len(req.objects)))
            row = [o for o in req.objects if isinstance(o, int)] + [b.blocks] * (b.blocks - len(req.objects))
            tab.append(tuple(self.num(v) for v in row))
        if len(model.requests) > sum(1 for i in range(b.requests) if b.req_id(i) in model.requests):
            raise ValueError("the model has requests outside r0..r{R-1}")
        return SymState(
            tuple(ref),
            tuple(klen),
            tuple(kbits),
            tuple(hashed),
            tuple(lost),
            tuple(fill),
            tuple(hits),
            tuple(pos),
            tuple(st),
            tuple(tlen),
            tuple(tbits),
            tuple(nb),
            tuple(tab),
        )


class NewestEncoding(Encoding):
    """The spec's allocator with ``duplicate_keys="newest"``: a new full block takes its key's index entry.

    The block that had the entry keeps its key, unreachable (``lost``), until it is
    evicted or reclaimed; when the entry's owner leaves, the key leaves the index.
    """

    name = "newest"
    duplicate_keys = "newest"
