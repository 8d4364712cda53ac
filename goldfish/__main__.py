import sys

from goldfish.cli import main

sys.exit(main())
