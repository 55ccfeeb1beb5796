"""Apply ``feature_config`` to typed rows: ids cleaned, tags split, dense values normalised.

Dense statistics (count, mean, std, min, max) over a window of days, merged from per-day
moments, are saved as ``_normalization.json`` beside the day's features, so serving can
apply the same transform to raw values. Normalisations (``recpipe.config.data.Normalizer``):
``log``: sign(x) * ln(1 + |x|); ``min_max``: (x - min) / (max - min) clipped to [0, 1];
``standard``: (x - mean) / std (std 0 -> 1). Missing values are filled before
normalising with ``default_val``, or with the window mean when it is unset.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from features.jvm import signed_log1p, trim_whitespace
from recpipe.config.data import FeatureConfig, FeatureSpec, FeatureType, InputType, Normalizer


def clean_id(col: Column, input_type: InputType) -> Column:
    """Clean an id value to its canonical string (``recpipe.ids`` step 1). A float (a rating
    in a behaviour history) is Spark's text of it: ``4.0``."""
    if input_type in (InputType.INT32, InputType.INT64):
        return F.coalesce(col.cast(T.LongType()).cast(T.StringType()), F.lit(""))
    if input_type != InputType.STRING:
        col = col.cast(T.StringType())
    return F.coalesce(trim_whitespace(col), F.lit(""))


def combo_id(cols: list[Column], input_types: list[InputType], feature: FeatureSpec) -> Column:
    """A ComboFeature's id: its inputs' cleaned ids joined by ``combo_join_sep``; empty
    (the missing id) when any input is missing, as a cross with a missing id is none."""
    ids = [clean_id(c, t) for c, t in zip(cols, input_types, strict=True)]
    missing = F.lit(False)
    for i in ids:
        missing = missing | (i == F.lit(""))
    return F.when(missing, F.lit("")).otherwise(F.concat_ws(feature.combo_join_sep, *ids)).alias(feature.name)


def split_tags(col: Column, separator: str) -> Column:
    """Split a tag string into cleaned, non-empty tokens (array<string>, empty when missing)."""
    tokens = F.split(F.coalesce(col, F.lit("")), _regex_literal(separator))
    cleaned = F.transform(tokens, trim_whitespace)
    return F.filter(cleaned, lambda t: t != "")


def _regex_literal(text: str) -> str:
    return "".join("\\" + ch if not ch.isalnum() else ch for ch in text)


def normalization_params(feature: FeatureSpec, stats: dict[str, float | None]) -> dict[str, float | str]:
    """The fill value and normaliser constants for one RawFeature, from its window stats."""
    mean = stats.get("mean")
    fill = feature.default_val if feature.default_val is not None else (mean if mean is not None else 0.0)
    params: dict[str, float | str] = {"method": feature.normalizer.value, "fill": float(fill)}
    if feature.normalizer == Normalizer.standard:
        std = stats.get("std") or 0.0
        params.update(mean=float(mean or 0.0), std=float(std) if std > 0 else 1.0)
    elif feature.normalizer == Normalizer.min_max:
        lo, hi = stats.get("min"), stats.get("max")
        lo = float(lo) if lo is not None else 0.0
        hi = float(hi) if hi is not None else lo + 1.0
        params.update(min=lo, max=hi if hi > lo else lo + 1.0)
    return params


def needs_statistics(features: list[FeatureSpec]) -> bool:
    """Whether any RawFeature's fill or normaliser depends on the window's statistics: a
    ``standard`` or ``min_max`` normaliser, or no ``default_val`` (filled with the mean).
    When none does, the features can be written before the day's moments are known."""
    return any(
        f.feature_type == FeatureType.RawFeature
        and (f.default_val is None or f.normalizer in (Normalizer.standard, Normalizer.min_max))
        for f in features
    )


def normalize(col: Column, params: dict[str, float | str]) -> Column:
    """Fill and normalise a dense column (float)."""
    x = F.coalesce(col.cast(T.DoubleType()), F.lit(params["fill"]))
    method = params["method"]
    if method == Normalizer.log.value:
        return signed_log1p(x)
    if method == Normalizer.min_max.value:
        x = F.least(F.greatest((x - params["min"]) / (params["max"] - params["min"]), F.lit(0.0)), F.lit(1.0))
    elif method == Normalizer.standard.value:
        x = (x - params["mean"]) / params["std"]
    return x.cast(T.FloatType())


def feature_columns(
    feature_config: FeatureConfig,
    types: dict[str, InputType],
    normalization: dict[str, dict[str, float | str]],
    histories: frozenset[str] = frozenset(),
) -> list[Column]:
    """One output column per feature, named by the feature's name. A SequenceFeature over one
    of ``histories`` (the job's own ``array<string>`` columns, ids cleaned) keeps it as it is;
    over a raw column it splits it like a tag string, keeping the order."""
    out = []
    for f in feature_config.features:
        col = F.col(f.input_names[0])
        if f.feature_type == FeatureType.IdFeature:
            out.append(clean_id(col, types[f.input_names[0]]).alias(f.name))
        elif f.feature_type == FeatureType.ComboFeature:
            out.append(combo_id([F.col(c) for c in f.input_names], [types[c] for c in f.input_names], f))
        elif f.feature_type == FeatureType.SequenceFeature:
            seq = col if f.input_names[0] in histories else split_tags(col, f.separator)
            out.append(seq.alias(f.name))
        elif f.feature_type == FeatureType.TagFeature:
            out.append(split_tags(col, f.separator).alias(f.name))
        else:
            out.append(normalize(col, normalization[f.name]).alias(f.name))
    return out
