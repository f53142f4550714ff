"""``python -m kvspec.cli ...``: the ``kvspec`` command without its console script."""

import sys

from kvspec.cli import main

sys.exit(main())
