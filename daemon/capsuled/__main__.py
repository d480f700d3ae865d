"""``python -m capsuled``: the same as the ``capsuled`` command."""

import sys

from capsuled.main import main

sys.exit(main())
