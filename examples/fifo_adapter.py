"""README's adapter: the FIFO pool of fifo_pool.py held to the spec, and its leaky twin."""

from fifo_pool import FifoPool, LeakyFifoPool

from kvspec.adapter import Capabilities, Config, ObjectView, Observation, Op, Outcome, RequestView, Semantics


class FifoPoolAdapter:
    name, pool_class = "fifo-pool", FifoPool
    capabilities = Capabilities(
        Semantics(exact=False, prefix_caching=False), ops=frozenset({"admit", "append", "release"})
    )

    def reset(self, config: Config) -> None:
        self.pool = self.pool_class(config.capacity, config.block_size)

    def apply(self, op: Op) -> Outcome:
        if op.op == "release":
            self.pool.release(op.req)
            return Outcome.ok()
        return Outcome.ok(0) if self.pool.grow(op.req, list(op.tokens)) else Outcome.refused()

    def observe(self) -> Observation:
        pool, bs = self.pool, self.pool.block_size
        blocks, requests = {}, {}
        for req, table in pool.tables.items():
            tokens = pool.tokens[req]
            requests[req] = RequestView(req, tuple(tokens), len(tokens), tuple(table))
            for i, block in enumerate(table):  # full blocks hold block_size tokens, the last the rest
                blocks[block] = ObjectView(block, size=1, tokens=min(bs, len(tokens) - i * bs), ref_count=1)
        return Observation(pool.capacity, len(pool.free), blocks, requests, index={})

    def events(self) -> list[object]:
        return []  # no prefix cache: nothing is ever evicted

    def close(self) -> None:
        pass


class LeakyFifoPoolAdapter(FifoPoolAdapter):
    name, pool_class = "leaky-fifo-pool", LeakyFifoPool
