"""Atomic writes: numbered directories claimed by writers racing in the same second."""

from __future__ import annotations

import threading

from recpipe import atomic


def test_writers_racing_for_one_version_number_get_distinct_complete_versions(tmp_path):
    root = tmp_path / "exports"
    root.mkdir()
    for attempt in range(10):
        barrier = threading.Barrier(3)
        published: list = []

        def write(name: str, barrier: threading.Barrier, published: list, first: int) -> None:
            tmp = atomic.temp_dir_beside(root / "export")
            (tmp / "saved_model.pb").write_text(name)
            barrier.wait()  # all three now pick the same number (the same second)
            published.append(atomic.publish_numbered(tmp, root, first))

        threads = [
            threading.Thread(target=write, args=(f"{attempt}-{i}", barrier, published, 1000 + 10 * attempt))
            for i in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len({p.name for p in published}) == 3
        contents = sorted((p / "saved_model.pb").read_text() for p in published)
        assert contents == [f"{attempt}-{i}" for i in range(3)]  # none replaced another
    assert not [p for p in root.iterdir() if not p.name.isdigit()]  # no temporary dir left
    versions = sorted(int(p.name) for p in root.iterdir())
    assert len(versions) == 30 and versions == sorted(set(versions))
