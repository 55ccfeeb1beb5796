"""``python -m recpipe.launch.horovodrun ARGS``: Horovod's ``horovodrun`` for jobs on this
machine, with its servers bound to 127.0.0.1.

Horovod binds the Gloo rendezvous server (and its driver and task services) to every
interface and has no setting for it; a local job needs none of them reachable from the
network, so ``find_port`` is swapped for one that binds the loopback address before
``horovodrun`` starts. With ``--network-interfaces lo`` the ranks reach it and each other there.
"""

# Imports inside functions: Horovod's runner is imported when a job is launched: the CLI and the
# operators load without it.

from __future__ import annotations


def _loopback_only() -> None:
    from horovod.runner.common.util import network as common_network
    from horovod.runner.http import http_server
    from horovod.runner.util import network

    find_port = network.find_port

    def loopback_find_port(server_factory):
        return find_port(lambda addr: server_factory(("127.0.0.1", addr[1])))

    for module in (network, http_server, common_network):
        module.find_port = loopback_find_port


def _ranks_forked(argv: list[str]) -> list[str]:
    """``argv`` with the ranks' ``python -m`` command started through the fork server when one
    is configured (``recpipe.forkserver``)."""
    import sys

    from recpipe.forkserver import forked

    for i in range(len(argv) - 1):
        if argv[i] == sys.executable and argv[i + 1] == "-m":
            return argv[:i] + forked(argv[i:])
    return argv


def main() -> None:
    import sys

    sys.argv[1:] = _ranks_forked(sys.argv[1:])
    _loopback_only()
    from horovod.runner.launch import run_commandline

    run_commandline()


if __name__ == "__main__":
    main()
