import sys

from goldfish.app.cli import main

sys.exit(main())
