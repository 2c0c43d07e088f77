"""Alembic migrations of periodic_manager (shipped inside the distribution)."""
