"""Measurement: the ``Measurer`` interface tuning measures through (measurer.py), the gateway that
implements it (the one place candidates are built and run), its worker processes, remote devices
under an RPC tracker, the timing lock and the runners' memory; and a replay measurer that builds
nothing (replay.py)."""
