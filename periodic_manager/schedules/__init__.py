"""A schedule as data: its definition, its rules, its files."""
