"""The search: the design space and the phases that propose candidates (reuse, storm, raindrop) with
their cost model and prior. Phases propose and are told; they measure nothing and store nothing."""
