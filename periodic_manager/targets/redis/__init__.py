"""The Redis Streams target and the helpers of every target that keeps state in Redis: claims,
previous tasks, sentinels, Lua scripts read from files, one translation of Redis errors."""
