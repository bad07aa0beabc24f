"""`python -m pg2sink` is the `pg2sink` command."""

import sys

from pg2sink.cli import main

sys.exit(main())
