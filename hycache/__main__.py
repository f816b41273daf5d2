"""`python -m hycache`: the `hycache` command line."""

import sys

from hycache.cli.main import main

sys.exit(main())
