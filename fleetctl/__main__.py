import sys

from fleetctl.cli import main

sys.exit(main())
