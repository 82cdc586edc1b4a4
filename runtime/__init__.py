"""Things that run: the CLI, the metrics catalogue, vLLM configuration, the tuner, KV compaction."""
