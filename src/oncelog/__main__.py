"""`python -m oncelog` is the `oncelog` command."""

import sys

from .cli import main

sys.exit(main())
