"""KV-cache compaction, shrink and grow inside vLLM 0.32 (plugin) and the sidecar that drives it.

Scheduler side and worker side are separate processes in vLLM; see ``plugin`` for which hook
runs where. ``planner`` and ``mover`` are pure of vLLM and reused by the benchmark.
"""
