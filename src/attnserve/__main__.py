"""`python -m attnserve`: the `attnserve` command (attnserve.cli)."""
import sys

from attnserve.cli import main

sys.exit(main())
