"""``python -m recpipe.forkserver.server SOCKET PARENT_PID [MODULE ...]``: import the modules
job processes import (given by the server's starter: ``trainer.preload`` for trainer jobs),
listen on ``SOCKET`` and fork one process per request (``recpipe.forkserver``).

A forked process starts its own session, joins the client's network and mount namespaces, takes the
client's standard streams, working directory and environment, and runs its module as
``python -m`` would. The server reports its exit status to the client, and kills it when the
client goes away first (a client killed with SIGKILL leaves no orphan). The server ends with
its parent (``PR_SET_PDEATHSIG``), killing what it forked.

A request whose environment names a resident (``RECPIPE_RESIDENT``, ``recpipe.forkserver.
resident``) runs in the process kept for that name, its module, working directory,
``PYTHONPATH`` and namespaces: one request at a time (a second one meanwhile gets a process of
its own), killed with its client as any other, and ended by the server after ``RESIDENT_IDLE_S``
without a request.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from recpipe.forkserver import protocol, resident

# variables read when those modules are imported: a process whose values differ is refused
IMPORT_TIME = ("TF_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "KERAS_", "XLA_", "PYTHON", "LD_", "MALLOC_")
# read after import: TF_CONFIG when the job starts its cluster; PYTHONPATH is applied to a
# forked process's sys.path, and this project's modules are imported again from it (PROJECT)
RUNTIME = frozenset({"TF_CONFIG", "PYTHONPATH"})
# scikit-learn and joblib setdefault these at their import, in whatever process launches a
# job (a test, a task that imported them); only Intel's OpenMP runtime reads them, and none
# of the preloaded modules loads it (NumPy and SciPy use OpenBLAS, TensorFlow its own pool)
UNREAD = frozenset({"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"})
PROJECT = resident.PROJECT

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
# the client's namespaces a forked process joins: its network, and its mounts (``ip netns
# exec`` mounts a host's own /etc/hosts in a mount namespace of its own)
NAMESPACES = (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS))
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
# seconds a resident waits for its next request before the server ends it (and its memory)
RESIDENT_IDLE_S = float(os.environ.get("RECPIPE_RESIDENT_IDLE_S", 7200))


def import_time(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that the preloaded modules may have read at import."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in RUNTIME | UNREAD}


@dataclass
class Resident:
    """A process kept for one resident key: its pid, its end of the request channel, the
    client it is serving (None: idle) and since when it idles (``time.monotonic``)."""

    pid: int
    pidfd: int
    channel: socket.socket
    client: socket.socket | None = None
    idle_since: float = field(default_factory=time.monotonic)
    ending: bool = False  # killed for idling: takes no more requests
    stale: bool = False  # the project's code changed since it started: ended once idle


class Server:
    """The fork server's state: the listening socket and, per forked process, its client."""

    def __init__(self, path: str, preload: tuple[str, ...] = ()):
        before = dict(os.environ)
        for name in preload:
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
        self.residents: dict[tuple, Resident] = {}

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
            key = resident.key_of(request, peer_ns)
            if key is not None and self.hand_over(key, request, fds, joins, conn):
                return
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

    def hand_over(self, key: tuple, request: dict, fds: list[int], joins: list, conn: socket.socket) -> bool:
        """Send the request to ``key``'s resident, forking it first when there is none; False
        when it is busy (the request gets a process of its own)."""
        kept = self.residents.get(key)
        if kept is not None and (kept.client is not None or kept.ending):
            return False
        if kept is None:
            for other, older in self.residents.items():
                if resident.same_but_code(key, other):
                    older.stale = True  # ended by end_idle_residents once it is idle
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:
                ours.close()
                self.close_inherited(conn)
                for fd in fds:  # this request's streams come over the channel, as every one's
                    os.close(fd)
                _resident(theirs, joins, self.defaults)  # never returns
            theirs.close()
            kept = Resident(pid, os.pidfd_open(pid), ours)
            self.residents[key] = kept
            self.selector.register(kept.pidfd, selectors.EVENT_READ, ("resident_exited", key))
            self.selector.register(ours, selectors.EVENT_READ, ("resident_done", key))
        try:
            protocol.send(kept.channel, request, fds)
        except OSError:  # it is exiting: its exit is handled; this request gets a fork
            return False
        protocol.send(conn, {"pid": kept.pid})
        conn.settimeout(None)
        kept.client = conn
        self.selector.register(conn, selectors.EVENT_READ, ("resident_client", key))
        return True

    def resident_done(self, key: tuple) -> None:
        """The resident's reply to its request: the exit status, passed on to the client."""
        kept = self.residents[key]
        try:
            reply, _ = protocol.receive(kept.channel)
        except (OSError, ValueError):
            reply = None
        if reply is None:  # it is ending: resident_exited reports it
            self.selector.unregister(kept.channel)
            return
        self._release(kept, reply)

    def _release(self, kept: Resident, reply: dict) -> None:
        if kept.client is None:
            return
        self.selector.unregister(kept.client)
        try:
            protocol.send(kept.client, reply)
        except OSError:
            pass
        kept.client.close()
        kept.client, kept.idle_since = None, time.monotonic()

    def resident_exited(self, key: tuple) -> None:
        kept = self.residents.pop(key)
        self.selector.unregister(kept.pidfd)
        os.close(kept.pidfd)
        _, status = os.waitpid(kept.pid, 0)
        self._release(kept, {"returncode": os.waitstatus_to_exitcode(status)})
        try:
            self.selector.unregister(kept.channel)
        except KeyError:
            pass  # resident_done saw the channel end first
        kept.channel.close()

    def resident_client_gone(self, key: tuple) -> None:
        # its client only ever reads: anything readable is its end; the request's work ends too
        kept = self.residents[key]
        self.selector.unregister(kept.client)
        kept.client.close()
        kept.client = None
        _kill(kept.pid, signal.SIGKILL)

    def end_idle_residents(self) -> float | None:
        """End the residents idle for ``RESIDENT_IDLE_S``, and idle ones whose code is stale;
        seconds to the next one's end."""
        now, next_end = time.monotonic(), None
        for kept in self.residents.values():
            if kept.client is None and not kept.ending:
                end = now if kept.stale else kept.idle_since + RESIDENT_IDLE_S
                if end <= now:
                    kept.ending = True
                    _kill(kept.pid, signal.SIGKILL)  # its exit is handled as any other
                else:
                    next_end = min(next_end or end, end)
        return None if next_end is None else next_end - now

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
        handlers = {
            "exited": lambda key, pid: self.exited(key.fd, pid),
            "client": lambda key, pid: self.client_gone(key.fileobj, pid),
            "resident_done": lambda key, name: self.resident_done(name),
            "resident_exited": lambda key, name: self.resident_exited(name),
            "resident_client": lambda key, name: self.resident_client_gone(name),
        }
        while True:
            for key, _ in self.selector.select(self.end_idle_residents()):
                what, arg = key.data
                if what == "accept":
                    self.accept()
                elif self.current(key):
                    handlers[what](key, arg)

    def current(self, key: selectors.SelectorKey) -> bool:
        """``key`` is still registered: an event of the same batch may have closed it (a
        resident's exit and its reply come together)."""
        try:
            return self.selector.get_key(key.fileobj) is key
        except (KeyError, ValueError):
            return False

    def stop(self) -> None:
        for pid in [*self.children, *(r.pid for r in self.residents.values())]:
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
        _detach(joins)
        code = _command(request, fds, env, reimport=True)
    except BaseException:  # before the command: the server's log has it
        sys.excepthook(*sys.exc_info())
    finally:
        try:
            import atexit

            threading._shutdown()  # as the interpreter's own exit: wait for non-daemon threads
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _command(request: dict, fds: list[int], env: dict[str, str], reimport: bool) -> int:
    """Run the request's command here with its streams, directory and environment; its exit
    status (an exception's traceback goes to its stderr)."""
    try:
        _take_streams(request, fds, env)
        _run(request["argv"], request["cwd"], reimport)
        return 0
    except SystemExit as e:
        return _exit_code(e.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1


def _detach(joins: list[tuple[int, int]]) -> None:
    """A forked process's own signals, session and end (the server's), in the client's
    namespaces."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the server's end is this process's end
    for fd, flag in joins:  # one thread after fork, as joining a mount namespace requires
        if _libc.setns(fd, flag) != 0:
            raise OSError(ctypes.get_errno(), f"setns into the client's namespace ({flag:#x})")


def _take_streams(request: dict, fds: list[int], env: dict[str, str]) -> None:
    """The client's standard streams, working directory and environment."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)


def _resident(channel: socket.socket, joins: list[tuple[int, int]], defaults: dict[str, str]) -> None:
    """A resident: run each request that comes over ``channel`` in this process, reply its
    exit status; exit after one that failed (its state is not to be trusted) or when the
    server closes the channel."""
    code = 1
    try:
        _detach(joins)
        for served, (request, fds) in enumerate(resident.requests(channel)):
            # the first request imports the project's modules afresh, as a forked process
            # does; later ones keep them, and what they hold
            code = _serve_one(request, fds, {**defaults, **request["env"]}, reimport=served == 0)
            protocol.send(channel, {"returncode": code})
            if code != 0:
                break
        else:
            code = 0
    except BaseException:
        sys.excepthook(*sys.exc_info())
    finally:
        os._exit(code)


def _serve_one(request: dict, fds: list[int], env: dict[str, str], reimport: bool) -> int:
    """One request in a resident: its streams, its command run here, its streams given back
    (the client's pipes see their end); its non-daemon threads waited for, as at an exit."""
    code = 1
    before = set(threading.enumerate())
    try:
        code = _command(request, fds, env, reimport)
    finally:
        for thread in set(threading.enumerate()) - before:
            if not thread.daemon:
                thread.join()
        sys.stdout.flush()
        sys.stderr.flush()
        null = os.open(os.devnull, os.O_RDWR)
        for target in range(3):
            os.dup2(null, target)
        for fd in [null, *fds]:
            os.close(fd)
    return code


def _run(argv: list[str], cwd: str, reimport: bool = True) -> None:
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
    for name in [m for m in sys.modules if reimport and m.split(".", 1)[0] in PROJECT]:
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
    path, parent, preload = sys.argv[1], int(sys.argv[2]), tuple(sys.argv[3:])
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        return  # the parent died before the line above
    server = Server(path, preload)

    def stop(signum, frame):
        server.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve()


if __name__ == "__main__":
    main()
