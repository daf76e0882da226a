"""`python -m tests.late_finish ARGS`: `python -m fastpop ARGS`, except that process 1 of a
distributed run reaches its end (`lockstep.finish`) LATE_FINISH_SECONDS after its run, as a
process still closing its collectors on a loaded machine does. The coordinator must wait for
it, however long, rather than shut its service down under it."""

import os
import sys
import time

if __name__ == "__main__":  # not in the collectors, which import this module again (spawn)
    import jax

    from fastpop.commands.cli import main
    from fastpop.distributed import lockstep

    finish = lockstep.finish

    def late_finish(lost: bool, code: int) -> None:
        if jax.process_index() == 1:
            time.sleep(float(os.environ["LATE_FINISH_SECONDS"]))
        finish(lost, code)

    lockstep.finish = late_finish
    sys.exit(main())
