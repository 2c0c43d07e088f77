"""Database models and engine setup (the schema is owned by migrations/)."""
