"""One module per concept; each function maps typed policy to plain Kubernetes object dicts."""
