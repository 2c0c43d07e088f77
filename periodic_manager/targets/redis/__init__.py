"""Targets and helpers that keep their state in Redis: streams, claims, previous tasks, sentinels."""
