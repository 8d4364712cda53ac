import sys

from goldfish.app.entry import main

sys.exit(main())
