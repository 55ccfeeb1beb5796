"""trainer.warm's compare-and-set: a job takes the kept state only when it starts from the
checkpoint the last job saved, unchanged on disk since, with the same config less its per-pass
fields, and does not resume; whatever it finds, the kept state is let go. Random sequences of
saves, rewrites of a checkpoint, config edits and takes (Hypothesis)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from trainer import warm

NAMES = ("ckpt-1", "ckpt-2", "ckpt-3")


def _config(model: str, source: str | None, model_dir: str = "runs/x") -> SimpleNamespace:
    doc = {"model_dir": model_dir, "train_ds": "2024-01-01/10", "model": model,
           "train_config": {"fine_tune_checkpoint": source, "num_steps": 5}}  # fmt: skip
    train = SimpleNamespace(fine_tune_checkpoint=source)
    return SimpleNamespace(
        to_dict=lambda: {**doc, "train_config": dict(doc["train_config"])}, train_config=train
    )


class WarmCompareAndSet(RuleBasedStateMachine):
    """The model: the kept (checkpoint, its content's version, config) or None."""

    @initialize()
    def start(self):
        self.root = Path(tempfile.mkdtemp(prefix="warm-"))
        self.previous_env = os.environ.get(warm.RESIDENT_ENV)
        os.environ[warm.RESIDENT_ENV] = "test"
        warm._kept = None
        self.versions = dict.fromkeys(NAMES, "")  # a checkpoint's content ("": not on disk)
        self.writes = 0
        self.kept = None

    def _write(self, name: str, same_size: bool = False) -> None:
        """A new size, or (``same_size``) other bytes of the same size written in place with
        the old mtime put back: only the content tells the two checkpoints apart."""
        self.writes += 1
        path = self.root / f"{name}.index"
        if same_size and path.exists():
            st = path.stat()
            with open(path, "r+") as f:  # in place: the same inode
                f.write(f"{self.writes:0{st.st_size}d}"[-st.st_size :])
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        else:
            path.write_text("x" * self.writes)
        self.versions[name] = path.read_text()

    @rule(name=st.sampled_from(NAMES), model=st.sampled_from(["a", "b"]))
    def a_job_saves_and_keeps(self, name, model):
        self._write(name)
        trainer = SimpleNamespace(config=_config(model, None), state=object(), saved=object(), dist=object(),
                                  traced=None)  # fmt: skip
        warm.keep(trainer, str(self.root / name))
        self.kept = (name, self.versions[name], model)

    @rule(name=st.sampled_from(NAMES), same_size=st.booleans())
    def a_checkpoint_is_written_again(self, name, same_size):
        self._write(name, same_size)

    @rule(
        name=st.sampled_from(NAMES),
        model=st.sampled_from(["a", "b"]),
        resume=st.booleans(),
        elsewhere=st.booleans(),
    )
    def a_job_takes(self, name, model, resume, elsewhere):
        source = str(self.root / name) if self.versions[name] else None
        config = _config(model, source, "runs/y" if elsewhere else "runs/x")  # model_dir: per pass
        got = warm.take(config, resume)
        fits = self.kept is not None and not resume and (name, self.versions[name], model) == self.kept
        assert (got is not None) == fits, (self.kept, name, self.versions[name], model, resume)
        self.kept = None

    @invariant()
    def the_kept_state_is_the_models(self):
        if getattr(self, "root", None) is None:
            return
        assert (warm._kept is None) == (self.kept is None)

    def teardown(self):
        warm._kept = None
        if getattr(self, "previous_env", None) is None:
            os.environ.pop(warm.RESIDENT_ENV, None)
        else:
            os.environ[warm.RESIDENT_ENV] = self.previous_env
        if getattr(self, "root", None) is not None:
            shutil.rmtree(self.root, ignore_errors=True)


WarmCompareAndSet.TestCase.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)
test_warm_compare_and_set = WarmCompareAndSet.TestCase


def test_a_job_outside_a_resident_keeps_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(warm.RESIDENT_ENV, raising=False)
    (tmp_path / "ckpt-1.index").write_text("x")
    trainer = SimpleNamespace(config=_config("a", None), state=1, saved=2, dist=3, traced=None)
    warm.keep(trainer, str(tmp_path / "ckpt-1"))
    assert warm._kept is None and not warm.enabled()


def test_a_checkpoint_rewritten_in_place_with_its_size_and_mtime_is_not_taken(tmp_path, monkeypatch):
    """Inode, size and mtime alike (a rewrite in place within the clock's grain, the mtime put
    back): the index's bytes differ, and the kept state is not taken."""
    monkeypatch.setenv(warm.RESIDENT_ENV, "test")
    monkeypatch.setattr(warm, "_kept", None)
    index = tmp_path / "ckpt-1.index"
    index.write_text("checksums-a")
    trainer = SimpleNamespace(
        config=_config("a", None), state=object(), saved=object(), dist=object(), traced=None
    )
    warm.keep(trainer, str(tmp_path / "ckpt-1"))
    before = index.stat()
    with open(index, "r+") as f:
        f.write("checksums-b")
    os.utime(index, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = index.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert warm.take(_config("a", str(tmp_path / "ckpt-1")), False) is None
