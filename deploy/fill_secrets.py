"""Fill every empty secret of a compose env file with a generated one (standard library only,
so it runs before any install):

    cp .env.example .env && python3 deploy/fill_secrets.py .env

A value already set is kept; the file is replaced atomically and left readable by its owner
only. Exit 2 with one line when the file is missing or names a key this script does not know.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
import tempfile
from pathlib import Path


def _token() -> str:
    return secrets.token_hex(24)


GENERATORS = {
    "POSTGRES_PASSWORD": _token,
    "AIRFLOW_JWT_SECRET": _token,
    # a Fernet key: 32 random bytes, URL-safe base64
    "AIRFLOW_FERNET_KEY": lambda: base64.urlsafe_b64encode(os.urandom(32)).decode(),
    "AIRFLOW_ADMIN_PASSWORD": _token,
    "REDIS_PASSWORD": _token,
    "MLFLOW_ADMIN_PASSWORD": _token,
    "MLFLOW_SECRET_KEY": lambda: secrets.token_hex(32),
}


def fill(text: str, where: str = ".env") -> str:
    """``text`` (an env file) with each empty ``KEY=`` of ``GENERATORS`` given a fresh value;
    comments, set values and other keys as they were.

    Raises:
        ValueError: an empty key that is not a secret this script generates (``where:line``).
    """
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#") and not value.strip():
            if key.strip() not in GENERATORS:
                raise ValueError(f"{where}:{n}: {key.strip()} is empty and is not a secret to generate")
            line = f"{key.strip()}={GENERATORS[key.strip()]()}"
        out.append(line)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 deploy/fill_secrets.py ENV_FILE", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        text = fill(path.read_text(), str(path))
    except (OSError, ValueError) as err:
        print(f"fill_secrets: {err}", file=sys.stderr)
        return 2
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
