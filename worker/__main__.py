"""`python -m worker` is `webhook-worker`."""

import sys

from worker.cli import main

sys.exit(main())
