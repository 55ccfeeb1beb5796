"""A stand-in for the trainer in launcher tests (``python -m tests.launch.standin KIND``):
joins the job as the trainer would, says so, then waits to be looked at."""

import sys
import time

if sys.argv[1] == "horovod":
    import horovod.tensorflow as hvd

    hvd.init()
    print("ready rank", hvd.rank(), flush=True)
else:
    print("ready", sys.argv[1], flush=True)
time.sleep(60)
