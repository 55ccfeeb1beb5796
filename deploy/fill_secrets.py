"""Fill the compose deployment's secrets directory, a file per secret, each service mounting
only the ones it uses (docker-compose.yaml's ``secrets:``); standard library only, so it runs
before any install:

    python3 deploy/fill_secrets.py secrets

A missing or empty file gets a generated value; a value already there is kept (set your own by
writing the file first). ``mlflow_credentials`` (MLflow's client credentials file, for the
worker's tasks and ``recpipe`` in it) follows ``mlflow_admin_password``, ``airflow_passwords``
(the simple auth manager's passwords file, for the api-server) ``airflow_admin_password``. The directory is
made readable by its owner only; the files in it readable by all, so that each container's user
can read the ones mounted into it (they are mounted one by one, not the directory). Exit 2 with
one line when the path is a file or cannot be written.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path


def _token() -> str:
    return secrets.token_hex(24)


GENERATORS = {
    "postgres_password": _token,
    "airflow_jwt_secret": _token,
    # a Fernet key: 32 random bytes, URL-safe base64
    "airflow_fernet_key": lambda: base64.urlsafe_b64encode(os.urandom(32)).decode(),
    "airflow_admin_password": _token,
    "broker_password": _token,  # the Celery broker's Redis (and its announcements)
    "store_password": _token,  # the online embedding store's Redis
    "mlflow_admin_password": _token,
    "mlflow_secret_key": lambda: secrets.token_hex(32),
}


def credentials(password: str) -> str:
    """MLflow's client credentials file (``~/.mlflow/credentials``) for its admin."""
    return f"[mlflow]\nmlflow_tracking_username = admin\nmlflow_tracking_password = {password}\n"


def airflow_passwords(password: str) -> str:
    """The Airflow simple auth manager's passwords file: ``{"admin": password}``."""
    return json.dumps({"admin": password}) + "\n"


# files that follow a secret: (name, the secret, how)
DERIVED = (
    ("mlflow_credentials", "mlflow_admin_password", credentials),
    ("airflow_passwords", "airflow_admin_password", airflow_passwords),
)


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def fill(directory: Path) -> list[str]:
    """Generate every missing or empty secret of ``GENERATORS`` in ``directory`` (made, mode
    0700) and rewrite each file of ``DERIVED`` that does not match its secret; the names written."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    written = []
    for name, make in GENERATORS.items():
        path = directory / name
        if not path.exists() or not path.read_text().strip():
            _write(path, make() + "\n")
            written.append(name)
    for name, source, make in DERIVED:
        wanted = make((directory / source).read_text().rstrip("\n"))
        path = directory / name
        if not path.exists() or path.read_text() != wanted:
            _write(path, wanted)
            written.append(name)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 deploy/fill_secrets.py SECRETS_DIR", file=sys.stderr)
        return 2
    try:
        written = fill(Path(args[0]))
    except OSError as err:
        print(f"fill_secrets: {args[0]}: {err.strerror}", file=sys.stderr)
        return 2
    print(f"fill_secrets: {len(written)} written in {args[0]}/ ({', '.join(written) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
