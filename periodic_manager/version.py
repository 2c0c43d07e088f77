"""The version of periodic_manager, in a module of its own: a part that names it (a manager's
heartbeat) need not import the package's face, which stands above every part."""

__version__ = "0.1.0"
