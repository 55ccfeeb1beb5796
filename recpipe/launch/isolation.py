"""What a local job's processes may see of their host: an allowlisted environment (none of the
Airflow worker's secrets) and, where the kernel allows it, a private network namespace that
only the job's own processes share, so that the TensorFlow servers (which listen on every
interface) and Horovod's ports are unreachable from any other host or process outside it.

``RECPIPE_JOB_NETWORK``: ``private`` (the default, and ``require``, its older name): a
namespace, or the job fails closed with the reason (a container without ``CAP_SYS_ADMIN``,
whose default seccomp profile refuses ``unshare``); ``host``: the operator opts out, and the
job runs on the host's network (a host or container whose network is private already).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import time

from recpipe.errors import PipelineError

log = logging.getLogger(__name__)

NETWORK_ENV = "RECPIPE_JOB_NETWORK"

# what every job process gets: unbuffered logs, no TensorFlow C++ start-up chatter
JOB_ENV = {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}

# what a training, evaluation or export process needs of the worker's environment
ALLOWED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "SHELL",
        "TERM",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "VIRTUAL_ENV",
        "JAVA_HOME",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "MALLOC_ARENA_MAX",
    }
)
ALLOWED_PREFIXES = ("LC_", "TF_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "HOROVOD_", "GLOO_", "NCCL_", "CUDA_")
ALLOWED_PREFIXES += ("KERAS_", "XLA_", "RECPIPE_")
# what Spark's launcher reads besides (SPARK_LOCAL_IP: the driver's address, HADOOP_CONF_DIR, ...)
SPARK_PREFIXES = ("SPARK_", "PYSPARK_", "HADOOP_", "YARN_", "KRB5")
# never passed, whatever its prefix: a name that looks like it holds a secret or a URL with one
SECRET = re.compile(
    r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|_KEY$|KEY_|_URL$|_URI$|_DSN$|AUTH|FERNET|JWT", re.I
)


class IsolationError(PipelineError):
    """No private network namespace can be made here and ``RECPIPE_JOB_NETWORK`` is not ``host``."""


def job_environment(
    extra: dict[str, str], environ: dict[str, str] | None = None, prefixes: tuple[str, ...] = ()
) -> dict[str, str]:
    """The environment of a job process: the allowlisted variables of ``environ`` (default
    ``os.environ``; ``ALLOWED``, ``ALLOWED_PREFIXES`` and the job kind's own ``prefixes``,
    never a name matching ``SECRET``), then the job's own ``extra`` (``TF_CONFIG``, ...),
    which are passed as given."""
    environ = os.environ if environ is None else environ
    starts = ALLOWED_PREFIXES + tuple(prefixes)
    kept = {
        k: v for k, v in environ.items() if (k in ALLOWED or k.startswith(starts)) and not SECRET.search(k)
    }
    return {**kept, **extra}


@functools.cache
def _namespace_argv() -> tuple[str, ...] | None:
    """How this process can make a network namespace (``unshare`` as root, or with a user
    namespace otherwise), or None when the kernel or the container refuses both."""
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("nsenter") is None:
        return None
    options = [("--net",)] if os.geteuid() == 0 else []
    options.append(("--user", "--map-root-user", "--net"))
    for opts in options:
        probe = subprocess.run([unshare, *opts, "true"], capture_output=True, timeout=10)
        if probe.returncode == 0:
            return (unshare, *opts)
    return None


class PrivateNetwork:
    """A network namespace for one job, held by a sleeping process (``holder``) with its
    loopback up; ``wrap(argv)`` runs a command inside it. ``close()`` ends the holder (the
    namespace goes when its last process does).

    Raises (at ``open``):
        IsolationError: no namespace can be made and ``RECPIPE_JOB_NETWORK`` is not ``host``.
    """

    def __init__(self):
        self.holder: subprocess.Popen | None = None
        self.user = False

    def open(self) -> PrivateNetwork:
        mode = os.environ.get(NETWORK_ENV, "private")
        if mode not in ("private", "require", "host"):
            raise IsolationError(f"${NETWORK_ENV}={mode!r}: private (the default) or host")
        if mode == "host":
            return self
        argv = _namespace_argv()
        if argv is None:
            raise IsolationError(
                "no private network namespace can be made here (unshare refused: a container "
                "without CAP_SYS_ADMIN?), and the job's TensorFlow servers would listen on every "
                f"interface of this host: give the worker CAP_SYS_ADMIN, or set {NETWORK_ENV}=host "
                "where the host's network is private already"
            )
        self.user = "--user" in argv
        self.holder = subprocess.Popen(
            [*argv, "sleep", "infinity"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.holder.pid}/ns/net") == mine:  # until unshare ran
            if time.monotonic() > deadline or self.holder.poll() is not None:
                self.close()
                raise IsolationError("the job's network namespace did not start")
            time.sleep(0.01)
        ip = shutil.which("ip") or "/usr/sbin/ip"
        up = subprocess.run(self.wrap([ip, "link", "set", "lo", "up"]), capture_output=True, text=True)
        if up.returncode != 0:
            self.close()
            raise IsolationError(f"cannot bring up the loopback of the job's namespace: {up.stderr.strip()}")
        return self

    @property
    def private(self) -> bool:
        return self.holder is not None

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (as it is without one)."""
        if self.holder is None:
            return argv
        join = ["--user", "--preserve-credentials"] if self.user else []
        return ["nsenter", f"--target={self.holder.pid}", *join, "--net", "--", *argv]

    def close(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(10)
        self.holder = None
