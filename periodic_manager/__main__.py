import sys

from periodic_manager.cli.main import main

sys.exit(main())
