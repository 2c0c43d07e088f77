"""What the tests share that is not a fixture: real servers, a cuttable TCP proxy, hostile rows,
a browser, worker apps run as subprocesses, and where the repository is."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository's root
