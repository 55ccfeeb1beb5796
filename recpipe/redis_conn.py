"""Where a Redis is and how to log in: the one resolver of the store's and the arrivals'
addresses, for the command line and the jobs (Airflow tasks take a connection id instead:
``operators/hooks/redis.py``).

A URL given on a command line never holds a password (``ps`` shows it to every user of the
host), neither as ``redis://:PASSWORD@host`` nor as ``?password=``; the password comes from
the environment's URL or a password file, and the connection is built from parts (host,
port, db, user, password), never by splicing a password into a URL, so any character of a
password (``/``, ``@``, ``#``) is just a character.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from recpipe.errors import UsageError

STORE_ENV = "RECPIPE_REDIS_URL"  # the online embedding store
ARRIVALS_ENV = "RECPIPE_ARRIVALS_REDIS_URL"  # the raw partitions' announcements
LOCAL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class RedisAddress:
    """A Redis, in parts: ``host`` (str), ``port`` (int), ``db`` (int), ``username`` and
    ``password`` (str or None), ``ssl`` (``rediss://``)."""

    host: str
    port: int
    db: int
    username: str | None = None
    password: str | None = None
    ssl: bool = False

    def where(self) -> str:
        """``host:port/db``, never the password: for messages."""
        return f"{self.host}:{self.port}/{self.db}"

    def client(self, timeout_s: float = 10.0):
        """A ``redis.Redis`` for this address (connect and read timeouts ``timeout_s`` seconds,
        so an unreachable store fails a command in seconds, not minutes)."""
        import redis

        return redis.Redis(
            host=self.host, port=self.port, db=self.db, username=self.username, password=self.password,
            ssl=self.ssl, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
        )  # fmt: skip


def url_password(url: str) -> str | None:
    """The password a Redis URL carries (``:PASSWORD@`` or ``?password=``), or None."""
    parts = urlsplit(url)
    query = parse_qs(parts.query).get("password")
    return unquote(parts.password) if parts.password else (query[0] if query else None)


def parse(url: str, source: str) -> RedisAddress:
    """``redis://[[user]:password@]host[:port][/db][?password=...]`` (or ``rediss://``) in parts.

    Raises:
        UsageError: not such a URL; ``source`` (the flag or variable it came from) is named.
    """
    try:
        parts = urlsplit(url)
        port = parts.port or 6379
    except ValueError as err:
        raise UsageError(f"{source}: {err}; expected redis://host:port/db") from None
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise UsageError(f"{source}: {url_without_password(url)!r} is no redis://host:port/db URL")
    path = parts.path.strip("/") or parse_qs(parts.query).get("db", ["0"])[0]
    if not path.isdigit():
        raise UsageError(f"{source}: the database {path!r} is no number (redis://host:port/DB)")
    return RedisAddress(
        host=parts.hostname,
        port=port,
        db=int(path),
        username=unquote(parts.username) if parts.username else None,
        password=url_password(url),
        ssl=parts.scheme == "rediss",
    )


def url_without_password(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password:
        netloc = f"{parts.username or ''}:***@" + netloc.rsplit("@", 1)[1]
    query = "&".join("password=***" if q.startswith("password=") else q for q in parts.query.split("&") if q)
    return parts._replace(netloc=netloc, query=query).geturl()


def add_arguments(parser, what: str, env: str = STORE_ENV, default: str | None = LOCAL) -> None:
    """``--redis_url`` (no password) and ``--redis_password_file`` on ``parser``, read back by
    ``resolve(args.redis_url, env=env, password_file=args.redis_password_file)``; ``what``
    says whose Redis it is, for the help."""
    fallback = f", else {default}" if default else "; none: not used"
    parser.add_argument(
        "--redis_url",
        default=None,
        help=f"{what}: redis://host:port/db without a password (ps shows a command line); "
        f"default ${env}{fallback}",
    )
    parser.add_argument("--redis_password_file", default=None, help=f"a file holding the password of {what}")


def password_file_env(env: str) -> str:
    """The variable naming the password file of ``env``'s URL: ``RECPIPE_REDIS_URL`` ->
    ``RECPIPE_REDIS_PASSWORD_FILE``."""
    return env.removesuffix("_URL") + "_PASSWORD_FILE"


def resolve(
    given: str | None = None,
    *,
    flag: str = "--redis_url",
    env: str = STORE_ENV,
    password_file: str | None = None,
    password_flag: str = "--redis_password_file",
    default: str | None = LOCAL,
) -> RedisAddress | None:
    """The Redis a command uses: ``given`` (a command-line URL, without a password), else
    ``$env``, else ``default``; the password from ``password_file`` when given, else, for
    ``$env``'s URL, from the file ``$<env>_PASSWORD_FILE`` names (``password_file_env``).

    Returns:
        The address, or None when nothing names one and ``default`` is None.

    Raises:
        UsageError: a password in ``given`` (use ``$env`` or the password file), an unreadable
            or empty password file, or a malformed URL (the flag or variable is named).
    """
    if given and url_password(given) is not None:
        raise UsageError(
            f"{flag} holds a password, which any user of this host can read from the process list: "
            f"give the URL in ${env}, or the password in {password_flag}"
        )
    url, source = (given, flag) if given else (os.environ.get(env), f"${env}")
    if not given and url and not password_file and os.environ.get(password_file_env(env)):
        # a deployment's URL without its password, and the file holding it (compose's secrets)
        password_file, password_flag = os.environ[password_file_env(env)], f"${password_file_env(env)}"
    if not url:
        url, source = default, "the default"
    if url is None:
        return None
    address = parse(url, source)
    if password_file:
        address = replace(address, password=read_password(password_file, password_flag))
    return address


def read_password(path: str, source: str) -> str:
    """The password in the file ``path`` (its text without the final newline); ``source``
    names where the path came from (a flag, a variable, a connection) in the error.

    Raises:
        UsageError: the file cannot be read, or is empty.
    """
    try:
        password = Path(path).read_text().rstrip("\n")
    except OSError as err:
        raise UsageError(f"{source} {path}: {err.strerror}") from None
    if not password:
        raise UsageError(f"{source} {path}: the file is empty")
    return password
