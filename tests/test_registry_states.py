"""The champion's moves over random interleavings (a Hypothesis stateful test) against a real
MLflow registry (SQLite): gates that read the champion and decide later, approvals that arrive
after a person moved it, manual sets and rollbacks, each move possibly cut off at any of its
writes (the process killed: its lock released by the kernel) and retried. After every step the
alias is where the accepted moves put it, no refused move wrote anything, the history is one
chain (each move's ``previous`` is the move before's ``version``), a retried move reaches the
target its first attempt chose, and nothing is left pending once every cut move was retried."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

MODEL = "states"
VERSIONS = 4
# the client calls a move makes, in order: a cut before any of them
CUTS = ("set_registered_model_tag", "set_registered_model_alias", "set_model_version_tag", "create_run",
        "delete_registered_model_tag")  # fmt: skip


class Cut(Exception):
    """The process ran this far and was killed."""


class CutClient:
    """A real ``MlflowClient`` whose ``cut``-th call of method ``at`` raises ``Cut`` first."""

    def __init__(self, client, at: str | None = None, cut: int = 1):
        self._client, self._at, self._left = client, at, cut

    def __getattr__(self, name):
        method = getattr(self._client, name)
        if name != self._at:
            return method

        def maybe_cut(*args, **kwargs):
            self._left -= 1
            if self._left == 0:
                raise Cut(name)
            return method(*args, **kwargs)

        return maybe_cut


class Champion(RuleBasedStateMachine):
    decisions = Bundle("decisions")
    template: Path  # an empty MLflow database, migrated once (set by the test)

    @initialize()
    def start(self):
        import shutil

        from mlflow import MlflowClient

        self.dir = Path(tempfile.mkdtemp(prefix="registry-states-"))
        shutil.copy(self.template, self.dir / "mlflow.db")
        uri = f"sqlite:///{self.dir / 'mlflow.db'}"
        self.client = MlflowClient(uri, uri)
        self.client.create_registered_model(MODEL)
        for n in range(1, VERSIONS + 1):
            model_dir = self.dir / "runs" / f"ds=2024-03-0{n}"
            model_dir.mkdir(parents=True)
            (model_dir / "_SUCCESS").touch()
            export = self.dir / "exports" / str(n)
            export.mkdir(parents=True)
            tags = {"ds": f"2024-03-0{n}", "model_dir": str(model_dir), "export_path": str(export)}
            self.client.create_model_version(MODEL, str(export), tags={**tags, "promotion": "promoted"})
        self.champion = None  # where the accepted moves put the alias
        self.cut_plan = None  # the target of a move cut off and not yet retried

    def teardown(self):
        import shutil

        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def _holder(self):
        from recpipe.registry import current

        found = current(self.client, MODEL)
        return None if found is None else int(found.version)

    # -- the gate and the approver: read now, move later ------------------------------------
    @rule(target=decisions, version=st.integers(1, VERSIONS))
    def a_gate_compares_with_the_champion(self, version):
        return (version, self._holder())

    @rule(decision=decisions, action=st.sampled_from(["promoted", "approved"]))
    def the_gate_or_an_approver_moves_it_later(self, decision, action):
        """Also while a person's move is written ahead and cut off: the gate does not wait."""
        from recpipe.registry import ChampionMovedError, move_alias

        version, expect = decision
        holder = self._holder()  # a cut move may have moved the alias already
        if expect != holder:
            with pytest.raises(ChampionMovedError):
                move_alias(self.client, MODEL, version, expect, by="gate", reason="r", action=action)
            return
        move_alias(self.client, MODEL, version, expect, by="gate", reason="r", action=action)
        if self.cut_plan is not None and not (holder == version == self.cut_plan[2]):
            self.cut_plan = (*self.cut_plan[:3], True)  # overtaken: its retry may be refused
        self.champion = version

    # -- a person: set or roll back, possibly cut off, then retried ------------------------
    def _move(self, action: str, version, cut):
        from recpipe.champion import move

        client = CutClient(self.client, *cut) if cut else self.client
        return move(client, MODEL, action, "by hand", "alice", version)

    @precondition(lambda self: self.cut_plan is None)
    @rule(
        version=st.integers(1, VERSIONS), cut=st.none() | st.tuples(st.sampled_from(CUTS), st.integers(1, 2))
    )
    def a_person_sets_it(self, version, cut):
        from recpipe.registry import pending

        try:
            record = self._move("set", version, cut)
        except Cut:
            plan = pending(self.client, MODEL)
            if plan is not None:  # cut after the move was written ahead
                self.cut_plan = ("set", plan["version"], plan["previous"], False)
            elif self._holder() == version:
                self.champion = version
            return
        assert record["version"] == version
        self.champion = version

    @precondition(lambda self: self.champion is not None and self.cut_plan is None)
    @rule(cut=st.none() | st.tuples(st.sampled_from(CUTS), st.integers(1, 2)))
    def a_person_rolls_it_back(self, cut):
        from recpipe.champion import ChampionError
        from recpipe.registry import pending

        before = self.champion
        try:
            record = self._move("rollback", None, cut)
        except Cut:
            plan = pending(self.client, MODEL)
            if plan is not None:
                self.cut_plan = ("rollback", plan["version"], plan["previous"], False)
            return
        except ChampionError as err:
            assert "nothing to roll back" in str(err)
            return
        assert record["version"] != before and record["previous"] == before
        self.champion = record["version"]

    @precondition(lambda self: self.cut_plan is not None)
    @rule()
    def the_cut_move_is_retried(self):
        from recpipe.champion import ChampionError
        from recpipe.registry import ChampionMovedError, pending

        action, target, _, overtaken = self.cut_plan
        try:
            record = self._move(action, target if action == "set" else None, None)
        except ChampionMovedError:
            assert overtaken, "refused though nobody moved the alias since"
            assert pending(self.client, MODEL) is None  # a refused move leaves nothing pending
            self.cut_plan = None
            try:  # the person looks again and rolls back: not jammed by the refused plan
                again = self._move("rollback", None, None)
            except ChampionError as err:
                assert "nothing to roll back" in str(err) and not isinstance(err, ChampionMovedError)
                return
            self.champion = again["version"]
            return
        assert record["version"] == target  # the target the first attempt chose
        self.champion, self.cut_plan = target, None

    # -- what holds after every step -----------------------------------------------------------
    @invariant()
    def the_alias_is_where_the_accepted_moves_put_it(self):
        if not hasattr(self, "client"):
            return
        holder = self._holder()
        if self.cut_plan is None:
            assert holder == self.champion
        else:  # cut: before its alias moved, or after
            assert holder in (self.champion, self.cut_plan[1])

    @invariant()
    def the_history_is_one_chain(self):
        if not hasattr(self, "client"):
            return
        from recpipe.registry import history, pending

        moves = history(self.client, MODEL)
        for before, after in zip(moves, moves[1:], strict=False):
            assert after["previous"] == before["version"], moves
        if moves and self.cut_plan is None:
            assert moves[-1]["version"] == self.champion
        if self.cut_plan is None:
            assert pending(self.client, MODEL) is None
        if moves:  # the registered model's page shows the same history, newest first
            text = self.client.get_registered_model(MODEL).description
            rows = [r for r in text.splitlines() if r.startswith("| 20")]
            assert len(rows) == len(moves) and rows[0].split(" | ")[1] == str(moves[-1]["version"]), text


def test_the_champions_moves_over_random_interleavings(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("RECPIPE_VAR_DIR", str(tmp_path))  # the registry's lock
    Champion.template = tmp_path / "template.db"
    uri = f"sqlite:///{Champion.template}"
    client = MlflowClient(uri, uri)
    client.search_experiments(max_results=1)  # the tables, created once
    client.search_registered_models(max_results=1)
    machine = Champion.TestCase
    machine.settings = settings(max_examples=25, stateful_step_count=12, deadline=None)
    machine().runTest()
