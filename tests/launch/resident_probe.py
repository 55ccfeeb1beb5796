"""``python -m tests.launch.resident_probe REPORT [EXIT_CODE | sleep]``: writes its pid, how
many requests its process ran (this one included: a count that outlives a request only in a
fork server's resident) and its network namespace to REPORT as JSON, prints one line, then
exits with EXIT_CODE or sleeps."""

import json
import os
import sys
import time

sys.recpipe_probe_runs = getattr(sys, "recpipe_probe_runs", 0) + 1
report = {"pid": os.getpid(), "runs": sys.recpipe_probe_runs, "netns": os.readlink("/proc/self/ns/net")}
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(report, f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print(f"run {sys.recpipe_probe_runs} of process {os.getpid()}", flush=True)
if sys.argv[2:] == ["sleep"]:
    time.sleep(120)
sys.exit(int(sys.argv[2]) if sys.argv[2:] else 0)
