"""`python -m tests.late_finish ARGS`: `python -m fastpop ARGS`, except that process 1 of a
distributed run reaches its end (`distributed.finish`) LATE_FINISH_SECONDS after its run, as a
process still closing its collectors on a loaded machine does. The coordinator must wait for
it, however long, rather than shut its service down under it."""

import os
import sys
import time

if __name__ == "__main__":  # not in the collectors, which import this module again (spawn)
    import jax

    from fastpop import distributed
    from fastpop.cli import main

    finish = distributed.finish

    def late_finish(lost: bool, code: int) -> None:
        if jax.process_index() == 1:
            time.sleep(float(os.environ["LATE_FINISH_SECONDS"]))
        finish(lost, code)

    distributed.finish = late_finish
    sys.exit(main())
