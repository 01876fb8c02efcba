"""Tuning runs: one task's tuner over its phases, the driver and task scheduler over a model's
tasks, what a run may spend (``budget``), the final verification. Measures through the gateway,
stores through the database."""
