"""``python -m capsule_client.cli``: ``capsulectl`` run by this interpreter."""

import sys

from .main import main

sys.exit(main())
