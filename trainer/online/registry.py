"""A model's online tables, shared by its embedding layers: each table (or group) by name, the
group each table joins, and what their lookups share (the clock, the kernels' switch)."""

from __future__ import annotations

from trainer.online.clock import EVClock


class OnlineTables:
    """The registry the builders hand to every embedding layer of one model, so that the deep
    and wide lookups of a feature share its table (ids, map, admission), as TorchRec's
    ``EmbeddingCollection`` config is kept apart from its modules and kernels.

    Args:
        clock: the model's ``EVClock`` (steps and days; tracked by the model as ``ev_clock``).
        fused_kernels: the tables' admission and training lookups in recpipe's kernels
            (``trainer.kernels.admit``, ``trainer.kernels.gather_rows``), not the stock ops
            (``train_config.fused_kernels``).
    """

    def __init__(self, clock: EVClock, fused_kernels: bool = False):
        self.clock, self.fused_kernels = clock, fused_kernels
        self._by_name: dict = {}
        self._groups: dict[str, tuple[str, list[str]]] = {}  # table -> (group name, members)

    def groups(self, specs: dict) -> dict[str, tuple[str, list[str]]]:
        """The group of each online table of ``specs`` (table -> ``(ev_params, embedding_dim)``):
        ``(group name, member tables)``. Tables of one ``ev_params`` and dimension share a group
        (``ev_group_dim<dim>``); a table alone is its own group, named after it. A table keeps
        the group the first layer gave it, so the model's layers agree."""
        given = self._groups
        buckets: dict = {}
        for table, (params, dim) in specs.items():
            if table not in given:
                buckets.setdefault((params.model_dump_json(), dim), []).append(table)
        taken = {name for name, _ in given.values()}
        for (_, dim), members in buckets.items():
            if len(members) == 1:
                given.update({t: (t, [t]) for t in members})
                continue
            name, k = f"ev_group_dim{dim}", 1
            while name in taken or name in specs:
                name, k = f"ev_group_dim{dim}_{k}", k + 1
            taken.add(name)
            given.update({t: (name, members) for t in members})
        return {t: given[t] for t in specs}

    def table(self, name: str, create):
        """The table ``name`` (an ``EmbeddingVariable``), made by ``create()`` the first time."""
        if name not in self._by_name:
            self._by_name[name] = create()
        return self._by_name[name]
