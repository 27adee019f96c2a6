import sys

from .startup.cli import main

sys.exit(main())
