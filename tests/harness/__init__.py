"""Real servers for integration tests: Prometheus, Alertmanager, vLLM (CPU build)."""
