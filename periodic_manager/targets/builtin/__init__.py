"""The built-in targets' plugins: one light module each, registered in ``pyproject.toml`` under
the entry-point group ``periodic_manager.targets`` like any other plugin."""
