"""Policy -> Kubernetes objects: pure builders shared by Pulumi and ``gpupool render``."""
