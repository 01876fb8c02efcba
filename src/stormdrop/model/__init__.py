"""Models: task extraction and tuning of a whole network, compiling and running it, the in-model
choice of records, and the peers it is timed against."""
