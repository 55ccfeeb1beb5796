"""``python -m tests.launch.forked_probe REPORT [EXIT_CODE | sleep | kill]``: writes what a job
process sees of itself (was TensorFlow imported before its first line ran, its network and
mount namespaces, /etc/hosts, environment, argv, working directory) to REPORT as JSON, then
exits with EXIT_CODE, sleeps, or kills itself with SIGKILL."""

import json
import os
import signal
import sys
import time

warm = "tensorflow" in sys.modules  # only a process forked from the fork server has it already
report = {
    "warm": warm,
    "pid": os.getpid(),
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "netns": os.readlink("/proc/self/ns/net"),
    "mntns": os.readlink("/proc/self/ns/mnt"),
    "hosts": open("/etc/hosts").read(),
    "env": dict(os.environ),
    "main": __name__,
}
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(report, f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print("probe wrote", sys.argv[1], flush=True)
if sys.argv[2:] == ["sleep"]:
    time.sleep(120)
if sys.argv[2:] == ["kill"]:
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(sys.argv[2]) if sys.argv[2:] else 0)
