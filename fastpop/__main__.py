import sys

from fastpop.gc_settings import tune_for_tracing

tune_for_tracing()  # before the command line's imports (JAX, flax, ...)

from fastpop.commands.cli import main  # noqa: E402

sys.exit(main())
