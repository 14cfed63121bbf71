"""``python -m gpuwatt`` runs the command line."""

import sys

from gpuwatt.cli import main

sys.exit(main())
