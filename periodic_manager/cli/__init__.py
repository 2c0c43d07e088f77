"""The ``periodic-manager`` command."""
