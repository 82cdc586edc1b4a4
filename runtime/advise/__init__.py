"""The advisor (``gpupool advise``): sweep policy variants on the owner's traces, pick one."""
