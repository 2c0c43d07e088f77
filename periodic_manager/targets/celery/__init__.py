"""The Celery target: its app, its wire format, the Redis writer and kombu's way."""
