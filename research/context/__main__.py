import sys

from research.context.cli import main

sys.exit(main())
