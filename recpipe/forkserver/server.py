"""``python -m recpipe.forkserver.server SOCKET PARENT_PID``: import what job processes import
(``PRELOAD``), listen on ``SOCKET`` and fork one process per request (``recpipe.forkserver``).

A forked process starts its own session, joins the client's network and mount namespaces, takes the
client's standard streams, working directory and environment, and runs its module as
``python -m`` would. The server reports its exit status to the client, and kills it when the
client goes away first (a client killed with SIGKILL leaves no orphan). The server ends with
its parent (``PR_SET_PDEATHSIG``), killing what it forked.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import socket
import sys

from recpipe.forkserver import protocol

# what trainer processes import: trainer's package first (it sets TensorFlow's variables), then
# the libraries (scipy.stats for the AUC's ranks, mlflow for an export's MLflow model)
PRELOAD = (
    "trainer",
    "tensorflow",
    "tf_keras",
    "pandas",
    "pyarrow.parquet",
    "pydantic",
    "yaml",
    "scipy.stats",
    "mlflow",
)
# variables read when those modules are imported: a process whose values differ is refused
IMPORT_TIME = ("TF_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "KERAS_", "XLA_", "PYTHON", "LD_", "MALLOC_")
# read after import: TF_CONFIG when the job starts its cluster; PYTHONPATH is applied to a
# forked process's sys.path, and this project's modules are imported again from it (PROJECT)
RUNTIME = frozenset({"TF_CONFIG", "PYTHONPATH"})
# scikit-learn and joblib setdefault these at their import, in whatever process launches a
# job (a test, a task that imported them); only Intel's OpenMP runtime reads them, and none
# of the preloaded modules loads it (NumPy and SciPy use OpenBLAS, TensorFlow its own pool)
UNREAD = frozenset({"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"})
PROJECT = ("trainer", "recpipe")

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
# the client's namespaces a forked process joins: its network, and its mounts (``ip netns
# exec`` mounts a host's own /etc/hosts in a mount namespace of its own)
NAMESPACES = (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS))
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def import_time(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that the preloaded modules may have read at import."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in RUNTIME | UNREAD}


class Server:
    """The fork server's state: the listening socket and, per forked process, its client."""

    def __init__(self, path: str):
        before = dict(os.environ)
        for name in PRELOAD:
            __import__(name)
        # what the preload set (trainer's setdefault of TF_USE_LEGACY_KERAS, ...): a forked
        # process gets them as its own import would have set them
        self.defaults = {k: v for k, v in os.environ.items() if k not in before}
        self.expected = import_time(dict(os.environ))
        self.namespaces = _namespaces("self")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path + ".new")
        os.rename(path + ".new", path)  # the path appears once the server is ready
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.children: dict[int, socket.socket] = {}  # pid -> its client's connection

    def refusal(self, request: dict, peer_ns: dict[str, str]) -> str | None:
        argv = request.get("argv")
        if not (isinstance(argv, list) and len(argv) >= 3 and argv[1] == "-m"):
            return "not a python -m command"
        if argv[0] != sys.executable:
            return f"another Python ({argv[0]}; this server runs {sys.executable})"
        env = {**self.defaults, **request["env"]}
        names = set(import_time(env)) | set(self.expected)
        differ = sorted(k for k in names if env.get(k) != self.expected.get(k))
        if differ:
            return f"the environment differs in {', '.join(differ)}, read at import"
        if peer_ns != self.namespaces and os.geteuid() != 0:
            return "the client is in another network or mount namespace, which only root can join"
        return None

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        fds: list[int] = []
        joins: list[tuple[int, int]] = []  # (namespace fd, its CLONE_* flag)
        try:
            request, fds = protocol.receive(conn, max_fds=3)
            if request is None or len(fds) != 3:
                raise ValueError("no request, or not three standard streams")
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            peer = int.from_bytes(creds[:4], sys.byteorder)
            peer_ns = _namespaces(str(peer))
            reason = self.refusal(request, peer_ns)
            if reason is not None:
                protocol.send(conn, {"refused": reason})
                conn.close()
                return
            for kind, flag in NAMESPACES:
                if peer_ns[kind] != self.namespaces[kind]:
                    joins.append((os.open(f"/proc/{peer}/ns/{kind}", os.O_RDONLY), flag))
            pid = os.fork()
            if pid == 0:
                self.close_inherited(conn)
                _child(request, fds, joins, {**self.defaults, **request["env"]})  # never returns
            protocol.send(conn, {"pid": pid})
        except (OSError, ValueError) as e:
            try:
                protocol.send(conn, {"refused": f"{type(e).__name__}: {e}"})
            except OSError:
                pass
            conn.close()
            return
        finally:
            for fd in [*fds, *(fd for fd, _ in joins)]:
                os.close(fd)
        conn.settimeout(None)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = conn
        self.selector.register(pidfd, selectors.EVENT_READ, ("exited", pid))
        self.selector.register(conn, selectors.EVENT_READ, ("client", pid))

    def close_inherited(self, conn: socket.socket) -> None:
        """In a forked process: close the server's sockets and descriptors (the server keeps
        answering the client; the process must not hold its connections open)."""
        for key in list(self.selector.get_map().values()):
            if isinstance(key.fileobj, socket.socket):
                key.fileobj.close()
            else:
                os.close(key.fd)
        self.selector.close()
        conn.close()

    def exited(self, pidfd: int, pid: int) -> None:
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        conn = self.children.pop(pid)
        try:
            self.selector.unregister(conn)
        except KeyError:
            pass  # the client had gone
        try:
            protocol.send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass
        conn.close()

    def client_gone(self, conn: socket.socket, pid: int) -> None:
        # a client only ever reads: anything readable is its end of stream
        self.selector.unregister(conn)
        _kill(pid, signal.SIGKILL)

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                what, pid = key.data
                if what == "accept":
                    self.accept()
                elif what == "exited":
                    self.exited(key.fd, pid)
                else:
                    self.client_gone(key.fileobj, pid)

    def stop(self) -> None:
        for pid in list(self.children):
            _kill(pid, signal.SIGKILL)


def _namespaces(pid: str) -> dict[str, str]:
    """Process ``pid``'s (or ``self``'s) namespaces of ``NAMESPACES``: kind -> its identity."""
    return {kind: os.readlink(f"/proc/{pid}/ns/{kind}") for kind, _ in NAMESPACES}


def _kill(pid: int, sig: int) -> None:
    for kill in (os.killpg, os.kill):  # its session, or the process before it made one
        try:
            kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _child(request: dict, fds: list[int], joins: list[tuple[int, int]], env: dict[str, str]) -> None:
    """The forked process: become the client's command, run it, exit with its status."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the server's end is this process's end
        for fd, flag in joins:  # one thread after fork, as joining a mount namespace requires
            if _libc.setns(fd, flag) != 0:
                raise OSError(ctypes.get_errno(), f"setns into the client's namespace ({flag:#x})")
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        _run(request["argv"], request["cwd"])
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
    finally:
        try:
            import atexit
            import threading

            threading._shutdown()  # as the interpreter's own exit: wait for non-daemon threads
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run(argv: list[str], cwd: str) -> None:
    import random
    import runpy

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=unbuffered)
    random.seed()  # a forked process must not share the server's random state
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    # sys.path as python -m would make it here: the working directory, then $PYTHONPATH, then
    # the interpreter's own; the project's modules come from there again, not the preload's
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in _SERVER_PYTHONPATH]
    sys.path[:] = [cwd, *inherited, *[p for p in base if p not in inherited]]
    for name in [m for m in sys.modules if m.split(".", 1)[0] in PROJECT]:
        del sys.modules[name]
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


_SERVER_PYTHONPATH = frozenset(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)


def main() -> None:
    path, parent = sys.argv[1], int(sys.argv[2])
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        return  # the parent died before the line above
    server = Server(path)

    def stop(signum, frame):
        server.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve()


if __name__ == "__main__":
    main()
