"""The database of every measurement: its schema, claims between concurrent tuners, and the
MetaSchedule JSON format it imports and exports (``metaschedule``)."""
