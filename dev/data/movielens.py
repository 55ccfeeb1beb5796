"""Fetch MovieLens-100K (GroupLens) into the local cache, verified.

Sources, in order: GroupLens' ``ml-100k.zip`` (converted to the tab-separated, typed-header
layout RecBole ships), else the ``recbole==1.2.1`` wheel from the package index, whose
``recbole/dataset_example/ml-100k/`` files are checked against known SHA-256 sums. The
GroupLens licence asks that the data not be redistributed: it is cached under ``data/``
(git-ignored), never committed.
"""

from __future__ import annotations

import hashlib
import io
import logging
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from datetime import UTC, datetime
from pathlib import Path

from recpipe import atomic
from recpipe.digest import file_sha256
from recpipe.errors import PipelineError

log = logging.getLogger(__name__)

GROUPLENS_URL = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
RECBOLE_WHEEL = "recbole==1.2.1"
WHEEL_DIR = "recbole/dataset_example/ml-100k/"
# SHA-256 of the files in the recbole 1.2.1 wheel (shared/data/movielens-100k/SHA256SUMS).
WHEEL_SHA256 = {
    "ml-100k.inter": "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
    "ml-100k.item": "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
    "ml-100k.user": "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972",
}
FILES = tuple(WHEEL_SHA256)
GENRES = (
    "unknown Action Adventure Animation Children's Comedy Crime Documentary Drama Fantasy "
    "Film-Noir Horror Musical Mystery Romance Sci-Fi Thriller War Western"
).split()
NUM_RATINGS, NUM_USERS, NUM_ITEMS = 100_000, 943, 1_682


class FetchError(PipelineError):
    """No source could deliver verified MovieLens files."""


def _cached(dest: Path) -> bool:
    source = dest / "SOURCE"
    if not source.exists() or not all((dest / name).exists() for name in FILES):
        return False
    if source.read_text().startswith("recbole"):
        return all(file_sha256(dest / n) == WHEEL_SHA256[n] for n in FILES)
    return True


def convert_grouplens_zip(blob: bytes) -> dict[str, str]:
    """Convert GroupLens' ml-100k.zip (u.data, u.user, u.item) to the RecBole layout.

    Returns:
        file name -> text of ``ml-100k.inter`` / ``.user`` / ``.item``.

    Raises:
        FetchError: the archive is damaged or does not hold 100,000 ratings of 943 users
            and 1,682 items.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            if archive.testzip() is not None:
                raise FetchError("ml-100k.zip: a member fails its CRC check")
            read = {n.split("/")[-1]: n for n in archive.namelist()}
            data = archive.read(read["u.data"]).decode("latin-1")
            users = archive.read(read["u.user"]).decode("latin-1")
            items = archive.read(read["u.item"]).decode("latin-1")
    except (zipfile.BadZipFile, KeyError) as err:
        raise FetchError(f"ml-100k.zip: not the GroupLens archive ({err})") from err
    inter = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    inter += [line for line in data.splitlines() if line.strip()]
    user = ["user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token"]
    user += [line.replace("|", "\t") for line in users.splitlines() if line.strip()]
    item = ["item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq"]
    for line in items.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        title = parts[1].rsplit(" (", 1)[0]
        year = parts[2][-4:] if parts[2] else ""
        genres = " ".join(g for g, flag in zip(GENRES, parts[5:], strict=False) if flag == "1")
        item.append(f"{parts[0]}\t{title}\t{year}\t{genres}")
    if (len(inter) - 1, len(user) - 1, len(item) - 1) != (NUM_RATINGS, NUM_USERS, NUM_ITEMS):
        raise FetchError(
            f"ml-100k.zip: expected {NUM_RATINGS} ratings, {NUM_USERS} users, {NUM_ITEMS} items; "
            f"got {len(inter) - 1}, {len(user) - 1}, {len(item) - 1}"
        )
    return {
        "ml-100k.inter": "\n".join(inter) + "\n",
        "ml-100k.user": "\n".join(user) + "\n",
        "ml-100k.item": "\n".join(item) + "\n",
    }


def _from_grouplens(tmp: Path, timeout: float) -> str:
    with urllib.request.urlopen(GROUPLENS_URL, timeout=timeout) as response:  # noqa: S310
        blob = response.read()
    for name, text in convert_grouplens_zip(blob).items():
        (tmp / name).write_text(text)
    return f"grouplens {GROUPLENS_URL} sha256={hashlib.sha256(blob).hexdigest()}"


def _from_wheel(tmp: Path) -> str:
    wheel_dir = tmp / "wheel"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir)]
    done = subprocess.run([*cmd, RECBOLE_WHEEL], capture_output=True, text=True)
    if done.returncode != 0:
        raise FetchError(f"pip download {RECBOLE_WHEEL} failed: {done.stderr.strip()[-500:]}")
    wheel = next(wheel_dir.glob("recbole-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        for name in FILES:
            (tmp / name).write_bytes(archive.read(WHEEL_DIR + name))
    for name in FILES:
        got = file_sha256(tmp / name)
        if got != WHEEL_SHA256[name]:
            raise FetchError(f"{wheel.name}: {name} has sha256 {got}, expected {WHEEL_SHA256[name]}")
    shutil.rmtree(wheel_dir)
    return f"recbole wheel {wheel.name}"


def fetch_movielens(cache_dir: str | Path = "data", source: str = "auto", timeout: float = 5.0) -> Path:
    """Make ``<cache_dir>/movielens-100k/ml-100k.{inter,user,item}`` present and verified.

    Args:
        cache_dir: the data cache root.
        source: ``auto`` (GroupLens, then the wheel), ``grouplens`` or ``wheel``.
        timeout: seconds to wait for GroupLens before falling back.

    Returns:
        The dataset directory. A verified cache is reused without any download.

    Raises:
        FetchError: every allowed source failed (each failure is in the message).
    """
    dest = Path(cache_dir) / "movielens-100k"
    if _cached(dest):
        return dest
    failures = []
    with atomic.directory(dest) as tmp:
        origin = None
        for name, fn in (
            ("grouplens", lambda: _from_grouplens(tmp, timeout)),
            ("wheel", lambda: _from_wheel(tmp)),
        ):
            if source not in ("auto", name):
                continue
            try:
                origin = fn()
                break
            except (OSError, FetchError, StopIteration) as err:
                log.warning("movielens: %s source failed: %s", name, err)
                failures.append(f"{name}: {err}")
        if origin is None:
            raise FetchError("could not fetch MovieLens-100K: " + "; ".join(failures))
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        (tmp / "SOURCE").write_text(f"{origin}\nfetched {stamp}\n")
    return dest
