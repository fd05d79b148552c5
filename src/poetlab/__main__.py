"""``python -m poetlab`` is the ``poetlab`` command."""

import sys

from poetlab.cli import main

sys.exit(main())
