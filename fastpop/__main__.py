import sys

from fastpop.commands.cli import main

sys.exit(main())
