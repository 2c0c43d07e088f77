"""The engine: the registered schedules, their instants and the timing loop that sends them."""
