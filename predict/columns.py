"""EasyRec's column flags of ``predict``: which input columns are kept (``--reserved_cols``),
which outputs are written under which names and types (``--output_cols``), and the names the
outputs take (EasyRec's ``probs`` / ``logits``, ``probs_<task>`` / ``logits_<task>``).

Source: EasyRec's docs, *Local 离线预测* (docs/source/predict/).
"""

from __future__ import annotations

from recpipe.errors import UsageError

ALL = "ALL_COLUMNS"
OUTPUT_TYPES = ("double", "float")


def easyrec_name(output: str) -> str:
    """The SavedModel's output name as EasyRec names it: ``probability`` -> ``probs``,
    ``logit`` -> ``logits``, ``probability_<task>`` -> ``probs_<task>``."""
    for ours, theirs in (("probability", "probs"), ("logit", "logits")):
        if output == ours or output.startswith(ours + "_"):
            return theirs + output[len(ours) :]
    return output


def output_columns(spec: str, available: list[str]) -> list[tuple[str, str]]:
    """``--output_cols``: ``ALL_COLUMNS`` (every output, as double) or ``"name type, ..."``
    with type ``double`` or ``float``.

    Args:
        spec: the flag's value.
        available: the model's outputs by their EasyRec names (``easyrec_name``).

    Returns:
        ``[(name, type)]`` in the order given.

    Raises:
        UsageError: an unknown output or type, or a name given twice.
    """
    if spec.strip() == ALL:
        return [(name, "double") for name in available]
    out: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, kind = item.partition(" ")
        kind = kind.strip().lower() or "double"
        if name not in available:
            raise UsageError(
                f"--output_cols: {name!r} is not an output of the model (it has: {', '.join(available)})"
            )
        if kind not in OUTPUT_TYPES:
            raise UsageError(
                f"--output_cols: {name} {kind}: the type must be one of {', '.join(OUTPUT_TYPES)}"
            )
        if name in dict(out):
            raise UsageError(f"--output_cols: {name} is given twice")
        out.append((name, kind))
    if not out:
        raise UsageError("--output_cols: give ALL_COLUMNS or at least one 'name type'")
    return out


def reserved_columns(spec: str, available: list[str], outputs: list[str]) -> list[str]:
    """``--reserved_cols``: the input columns copied to the output beside the scores,
    ``ALL_COLUMNS`` (the default), a comma-separated list, or empty for none.

    Raises:
        UsageError: a column the input does not have, or one named like an output.
    """
    names = available if spec.strip() == ALL else [c.strip() for c in spec.split(",") if c.strip()]
    for name in names:
        if name not in available:
            raise UsageError(
                f"--reserved_cols: the input has no column {name!r} (it has: {', '.join(available)})"
            )
        if name in outputs:
            raise UsageError(f"--reserved_cols: {name!r} is also an output column; leave it out or rename it")
    return names


def selected_columns(spec: str | None, names: list[str]) -> list[str] | None:
    """``--selected_cols``: the input columns to read, by name or by 0-based position
    (EasyRec's CSV form); None: all.

    Raises:
        UsageError: a name or position the input does not have.
    """
    if not spec:
        return None
    chosen = []
    for item in (c.strip() for c in spec.split(",") if c.strip()):
        if item.isdigit():
            if int(item) >= len(names):
                raise UsageError(f"--selected_cols: position {item} is past the input's {len(names)} columns")
            item = names[int(item)]
        elif item not in names:
            raise UsageError(
                f"--selected_cols: the input has no column {item!r} (it has: {', '.join(names)})"
            )
        chosen.append(item)
    return chosen
