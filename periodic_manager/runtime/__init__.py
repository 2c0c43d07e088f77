"""A running manager: the engine fed by a provider, with leadership, sync, heartbeat and publishing."""
