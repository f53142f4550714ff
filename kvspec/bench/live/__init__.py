"""Live A/B workload benchmark: unique prompts against one long shared prefix on a real vLLM server.

``kvspec bench live`` runs two workloads that differ only in how much of their prompts they share:

- ``unique``: every request is a distinct random prompt of P tokens, so the prefix cache can serve
  nothing and the small block pool keeps evicting;
- ``shared``: every request is one long shared prefix of S tokens plus a short unique suffix of
  P - S tokens, so after the first wave each request finds S tokens (whole blocks) cached.

Both arms send the same number of requests N, each of P prompt tokens (token-id lists) with
``max_tokens=O``, ``ignore_eos`` and temperature 0, at the same concurrency C, streamed so the
first token's arrival is seen. Each run gets a freshly started server (no cache carried over),
and runs come in pairs in alternating order (unique, shared), (shared, unique), ... so an order
effect shows as a difference between a pair's first and second run rather than as an arm's gain.

Per request: TTFT (time to the first streamed token), TPOT ((end - first) / (tokens - 1)),
``usage.prompt_tokens_details.cached_tokens``; per run: requests/s and output tokens/s over the
run's wall time, failures (non-200, a stream error, a broken stream: counted, never raised), and
the raw /metrics text before and after with the prefix-cache counters' deltas. A metric that
the server does not expose is recorded as ``None`` (unavailable), never inferred from latency.

The modules, in the order a run uses them:

- :mod:`.workload`: the workload's figures and each arm's prompts;
- :mod:`.load`: one run's closed-loop load (the requests themselves are
  :func:`kvspec.adapters.vllm_live.client.stream_completion`);
- :mod:`.stats`: percentiles, the summary of a run and of an arm, the shared/unique ratios;
- :mod:`.run`: the A/B driver, a fresh server per run from a launcher, /metrics before and after;
- :mod:`.launcher`: the launcher of the kit's tiny vLLM server;
- :mod:`.schema`: the check of a result against its JSON Schema, ``kvspec/schemas/bench-live.schema.json``;
- :mod:`.render`: the table and the plot;
- :mod:`.benchmark`: the entry point ``kvspec bench live`` calls: options in, exit code out, the JSON
  written (also when interrupted, or when a server does not start).
"""
