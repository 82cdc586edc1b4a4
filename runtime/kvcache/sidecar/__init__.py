"""The compaction sidecar: a process of its own in each flex pod (``gpupool kv-sidecar run``)
that reads the instance's metrics, decides, and drives the plugin over the control socket.
Nothing here runs inside vLLM."""
