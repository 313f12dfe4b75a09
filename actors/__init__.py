"""Ray hosts for the core: client actors and the coordinator actor."""
