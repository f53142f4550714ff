"""The live vLLM adapter: a real OpenAI-compatible server checked from the outside.

- :mod:`.server`: the tiny server the kit starts (and always stops);
- :mod:`.client`: its HTTP API (JSON requests, the timed streamed completion, /metrics, /health),
  the one client of the adapter and of ``kvspec bench live``;
- :mod:`.events`: the KV cache event subscriber (ZMQ), gaps filled from the replay socket;
- :mod:`.hashing`: vLLM's published block hash, recomputed from the tokens;
- :mod:`.metrics`: /metrics parsed with prometheus-client, and counter deltas;
- :mod:`.recorded`: the recorded-log schema and :func:`check_recorded`;
- :mod:`.adapter`: the ``vllm-live`` adapter that drives completions requests.

Only :mod:`.recorded` and :mod:`.hashing` are imported here: they need neither vLLM nor ZMQ,
so a recorded log can be checked on any machine.
"""

from __future__ import annotations
