"""KV preservation across evictions: vLLM's filesystem tier on the snapshot volume, keyed by
compatibility, bounded by a GC, flushed within the grace period (docs/kvcache.md)."""
