import sys

from periodic_manager.cli import main

sys.exit(main())
