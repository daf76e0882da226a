import sys

from fastpop.cli import main

sys.exit(main())
