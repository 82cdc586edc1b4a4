"""KV-cache compaction, shrink and grow of vLLM 0.32, laid out by the process each module runs in.

- ``in_vllm/``: inside vLLM's processes (the plugin; EngineCore and worker halves).
- ``sidecar/``: the compaction sidecar, a process of its own in the flex pod.
- here: what both sides share: ``planner`` (pure move plans), ``limits`` (what a request
  carries, and the shrink floor) and ``control`` (the token-checked socket between them).
The sidecar's container spec is built with the Deployment (``infra.builders.compaction_sidecar``).
"""
