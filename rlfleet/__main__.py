"""``python -m rlfleet`` runs the command line."""

import sys

from rlfleet.cli import main

sys.exit(main())
