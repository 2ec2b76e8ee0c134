import sys

from metasd.cli import main

sys.exit(main())
