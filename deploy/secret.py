"""A compose service's secrets, read from their files (``/run/secrets/<name>``, or
``$RECPIPE_SECRETS_DIR``) where the service needs them, never from its environment or the
compose file (standard library only: the stand-in images run it too):

    python3 deploy/secret.py url 'postgresql+psycopg2://recpipe:{postgres_password}@postgres:5432/airflow'
    python3 deploy/secret.py value airflow_fernet_key
    python3 deploy/secret.py exec --url VAR=TEMPLATE --raw VAR=NAME -- COMMAND ARGS...

``url`` prints the template with each ``{name}`` replaced by that secret, percent-encoded (a
password holding ``/``, ``@`` or ``:`` stays one part of the URL) and ``value`` the secret as
it is, both without a final newline (Airflow's ``*_CMD`` settings take the output whole).
``exec`` runs COMMAND with ``VAR`` set to a URL so built (``--url``) or to a secret as it is
(``--raw``), in its environment only, never on its command line. Exit 2 with
one line naming the secret when its file is missing or empty.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from urllib.parse import quote

FIELD = re.compile(r"\{([a-z0-9_]+)\}")


class SecretError(Exception):
    """A secret's file is missing, unreadable or empty."""


def read(name: str) -> str:
    """The secret ``name`` (its file's text without the final newline).

    Raises:
        SecretError: no such file, unreadable, or empty (the path is named).
    """
    path = Path(os.environ.get("RECPIPE_SECRETS_DIR", "/run/secrets")) / name
    try:
        value = path.read_text().rstrip("\n")
    except OSError as err:
        raise SecretError(f"secret {name}: {path}: {err.strerror}") from None
    if not value:
        raise SecretError(f"secret {name}: {path} is empty")
    return value


def url(template: str) -> str:
    """``template`` with each ``{name}`` replaced by ``quote(read(name), safe="")``."""
    return FIELD.sub(lambda m: quote(read(m.group(1)), safe=""), template)


def _pairs(args: list[str]) -> tuple[dict[str, str], list[str]]:
    env, rest = {}, list(args)
    while rest and rest[0] in ("--url", "--raw"):
        kind, pair = rest[0], rest[1] if len(rest) > 1 else ""
        var, sep, value = pair.partition("=")
        if not sep or not var:
            raise SecretError(f"{kind} {pair!r}: expected VAR=VALUE")
        env[var] = url(value) if kind == "--url" else read(value)
        rest = rest[2:]
    if rest[:1] != ["--"] or len(rest) < 2:
        raise SecretError("exec: expected -- COMMAND after the variables")
    return env, rest[1:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) == 2 and args[0] in ("url", "value"):
            sys.stdout.write(url(args[1]) if args[0] == "url" else read(args[1]))
            return 0
        if args[:1] == ["exec"]:
            env, command = _pairs(args[1:])
            os.execvpe(command[0], command, {**os.environ, **env})
        usage = "usage: secret.py url TEMPLATE | value NAME | exec [--url|--raw VAR=...]... -- COMMAND"
        print(usage, file=sys.stderr)
    except SecretError as err:
        print(f"secret.py: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
