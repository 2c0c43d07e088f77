"""Fixtures of the target tests: the throwaway Redis Cluster (started on first use, once)."""

from tests.support.cluster import redis_cluster  # noqa: F401  (a fixture)
