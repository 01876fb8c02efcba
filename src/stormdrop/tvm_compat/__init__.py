"""Where stormdrop meets TVM's own interfaces: patches and work-arounds, the trace JSON format,
NVRTC for CUDA candidates, and the child process that keeps TVM's crashes away."""
