"""Measurement: the gateway (the one place candidates are built and run), its worker processes,
remote devices under an RPC tracker, the timing lock and the runners' memory."""
