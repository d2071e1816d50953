"""`python -m kevin_backend` runs the `kevin` command line."""

import sys

from kevin_backend.cli.main import main

sys.exit(main())
