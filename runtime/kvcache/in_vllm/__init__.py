"""Runs inside vLLM's own processes: the plugin, and what it does in the EngineCore (plan,
scheduler-side renames, the engine's control requests) and in each worker (copies, block
tables, resizes). Nothing here runs in the sidecar."""
