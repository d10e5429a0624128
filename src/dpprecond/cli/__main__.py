"""``python -m dpprecond.cli``: the ``dpprecond`` command."""

import sys

from dpprecond.cli import main

sys.exit(main())
