import sys

from attnserve.service.cli import main

sys.exit(main())
