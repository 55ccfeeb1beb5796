"""Read raw delimited logs as strings and split them into typed rows and quarantined rows.

A row is quarantined, with a reason, when a non-empty value does not parse as its declared
``input_type``, when it has more columns than declared, or when a label is missing. Empty
values of feature columns are missing values (filled later), not errors.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from recpipe.config.data import InputField, InputType
from recpipe.errors import PipelineError

SPARK_TYPES = {
    InputType.STRING: T.StringType(),
    InputType.INT32: T.IntegerType(),
    InputType.INT64: T.LongType(),
    InputType.FLOAT: T.FloatType(),
    InputType.DOUBLE: T.DoubleType(),
    InputType.BOOL: T.BooleanType(),
}
EXTRA = "_extra_columns"
SOURCE = "_source_file"
REASON = "_reason"
BAD = "_bad"
RAW_PREFIX = "_raw_"


class RawInputError(PipelineError):
    """A raw partition is missing, unreadable, or has a header that does not match the config."""


def data_files(partition: Path) -> list[Path]:
    """The data files of a partition directory (hidden and ``_`` files excluded).

    Raises:
        RawInputError: the directory does not exist or holds no data file.
    """
    if not partition.is_dir():
        raise RawInputError(f"raw partition not found: {partition}")
    files = sorted(p for p in partition.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))
    if not files:
        raise RawInputError(f"raw partition has no data file: {partition}")
    return files


def check_header(path: Path, fields: list[InputField], separator: str) -> None:
    """Check that a file's header names exactly the declared fields, in order.

    Raises:
        RawInputError: unreadable file or another header (names the file and both headers).
    """
    try:
        with open(path, encoding="utf-8") as f:
            header = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as err:
        raise RawInputError(f"cannot read raw file {path}: {err}") from err
    got = [h.strip().strip('"') for h in header.split(separator)]
    want = [f.input_name for f in fields]
    if got != want:
        raise RawInputError(
            f"{path}: header {got} does not match data_config.input_fields {want} "
            "(files without a header line: set data_config.with_header: false)"
        )


def read_strings(
    spark: SparkSession, files: list[Path], fields: list[InputField], separator: str, with_header: bool = True
) -> DataFrame:
    """Read delimited files as all-string columns, matched to ``fields`` by position, plus
    ``_extra_columns`` (a value beyond the declared ones) and the source file name. With
    ``with_header`` the first line of each file is skipped (``check_header`` checks it)."""
    schema = T.StructType(
        [T.StructField(f.input_name, T.StringType()) for f in fields] + [T.StructField(EXTRA, T.StringType())]
    )
    df = (
        spark.read.option("header", with_header)
        .option("sep", separator)
        .option("mode", "PERMISSIVE")
        .schema(schema)
        .csv([str(p) for p in files])
    )
    return df.withColumn(SOURCE, F.input_file_name())


# the Parquet types each input_type accepts (pyarrow's predicates); a string column always is:
# its values are parsed like text, and those that do not parse are quarantined
_PARQUET_TYPES = {
    InputType.STRING: (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean),
    InputType.INT32: (pa.types.is_integer,),
    InputType.INT64: (pa.types.is_integer,),
    InputType.FLOAT: (pa.types.is_integer, pa.types.is_floating),
    InputType.DOUBLE: (pa.types.is_integer, pa.types.is_floating),
    InputType.BOOL: (pa.types.is_boolean,),
}


def check_parquet_schema(path: Path, fields: list[InputField]) -> tuple[str, ...]:
    """Check that a Parquet file holds every declared column with a type its ``input_type``
    accepts: integers for INT32 / INT64, integers or floats for FLOAT / DOUBLE, booleans for
    BOOL, and strings or any of those for STRING (other columns are ignored).

    Returns:
        The declared columns' types in the file (Arrow's names), in ``fields`` order.

    Raises:
        RawInputError: unreadable file, missing columns, or a column of another type (names
            the file, the column, its type and the declared one).
    """
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as err:
        raise RawInputError(f"cannot read raw file {path}: {err}") from err
    missing = [f.input_name for f in fields if f.input_name not in schema.names]
    if missing:
        raise RawInputError(f"{path}: columns {missing} of data_config.input_fields are missing")
    for field in fields:
        kind = schema.field(field.input_name).type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            continue
        if not any(accepts(kind) for accepts in _PARQUET_TYPES[field.input_type]):
            raise RawInputError(
                f"{path}: column {field.input_name!r} is {kind} in the file, "
                f"data_config.input_fields declares {field.input_type.value}"
            )
    return tuple(str(schema.field(f.input_name).type) for f in fields)


def read_parquet_strings(spark: SparkSession, files: list[Path], fields: list[InputField]) -> DataFrame:
    """Read the declared columns of Parquet files (checked with ``check_parquet_schema``) as
    strings, in the shape ``read_strings`` gives, so that ``parse`` types them and quarantines
    what does not parse, as for text. Files whose column types differ (a day written by two
    producers) are read apart, each with its own schema, and united."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for path in files:
        groups.setdefault(check_parquet_schema(path, fields), []).append(str(path))
    parts = [
        spark.read.parquet(*paths).select(
            *[F.col(f.input_name).cast(T.StringType()).alias(f.input_name) for f in fields],
            F.lit(None).cast(T.StringType()).alias(EXTRA),
        )
        for paths in groups.values()
    ]
    return functools.reduce(DataFrame.unionByName, parts).withColumn(SOURCE, F.input_file_name())


def _blank(col: Column) -> Column:
    return col.isNull() | (F.trim(col) == "")


def _defaulted(value: Column, raw: Column, field: InputField) -> Column:
    """``value``, or the field's ``default_val`` (typed) where the raw text is blank."""
    if field.default_val is None:
        return value
    default = F.lit(field.default_val.strip() or field.default_val).try_cast(SPARK_TYPES[field.input_type])
    return F.when(_blank(raw), default).otherwise(value)


def parse(df: DataFrame, fields: list[InputField], labels: list[str]) -> DataFrame:
    """Cast the string columns to their declared types, keeping the raw strings for quarantine.
    A blank value of a field with ``default_val`` takes that value (EasyRec's
    ``input_fields.default_val``); a label with one is never missing.

    Returns:
        The declared columns, typed; each raw string as ``_raw_<name>``; ``_source_file``;
        ``_bad`` (boolean), true when the row is quarantined; ``_reason``, empty for a good
        row, else every problem of the row joined by "; ". Select rows by ``_bad``: Spark
        compiles a filter on the joined reasons of a wide schema past its code-generation
        limit and runs it interpreted, at twice the cost of the whole parse.
    """
    extra = F.col(EXTRA).isNotNull()
    problems = [(extra, F.lit("more columns than data_config.input_fields"))]
    typed = []
    for field in fields:
        raw = F.col(field.input_name)
        value = raw
        if field.input_type != InputType.STRING:
            # the casts strip surrounding whitespace themselves (a trim first costs ~0.1 us a value)
            value = raw.try_cast(SPARK_TYPES[field.input_type])
            if field.input_type in (InputType.FLOAT, InputType.DOUBLE):
                # integral text (most counts) is cast as a long first: that cast reads the
                # bytes, a float cast decodes a Java String for parseDouble. "-0" reads as 0.0
                whole = raw.try_cast(T.LongType()).cast(SPARK_TYPES[field.input_type])
                value = F.coalesce(whole, value)
            problem = F.concat(
                F.lit(f"{field.input_name}: cannot parse '"), raw, F.lit(f"' as {field.input_type.value}")
            )
            # blankness (a trim) is checked only for the values that did not parse
            problems.append((value.isNull() & ~_blank(raw), problem))
        typed.append(_defaulted(value, raw, field).alias(field.input_name))
    defaulted = {f.input_name for f in fields if f.default_val is not None}
    for label in labels:
        if label not in defaulted:
            problems.append((_blank(F.col(label)), F.lit(f"{label}: missing label")))
    bad = functools.reduce(lambda a, b: a | b, [cond for cond, _ in problems])
    return df.select(
        *typed,
        *[F.col(f.input_name).alias(RAW_PREFIX + f.input_name) for f in fields],
        F.col(EXTRA).alias(RAW_PREFIX + EXTRA),
        F.col(SOURCE),
        bad.alias(BAD),
        F.concat_ws("; ", *[F.when(cond, text) for cond, text in problems]).alias(REASON),
    )


def quarantined(parsed: DataFrame, fields: list[InputField]) -> DataFrame:
    """The rejected rows of ``parse``'s output as their raw strings, with reason and file."""
    return parsed.filter(F.col(BAD)).select(
        *[F.col(RAW_PREFIX + f.input_name).alias(f.input_name) for f in fields],
        F.col(RAW_PREFIX + EXTRA).alias(EXTRA),
        F.col(SOURCE),
        F.col(REASON),
    )


def read_dimension(spark: SparkSession, path: Path, fields: list[InputField], separator: str) -> DataFrame:
    """Read the declared columns of a dimension snapshot (other columns are ignored).

    Values that do not parse become missing (nulls): a dimension row never drops an event.

    Raises:
        RawInputError: the file is missing, or lacks a declared column (names both).
    """
    if not path.is_file():
        raise RawInputError(f"dimension table not found: {path}")
    df = spark.read.option("header", True).option("sep", separator).csv(str(path))
    missing = [f.input_name for f in fields if f.input_name not in df.columns]
    if missing:
        raise RawInputError(f"{path}: columns {missing} of data_config.dimension_tables are missing")
    columns = []
    for f in fields:
        raw = F.col(f.input_name)
        value = raw if f.input_type == InputType.STRING else F.trim(raw).try_cast(SPARK_TYPES[f.input_type])
        columns.append(_defaulted(value, raw, f).alias(f.input_name))
    return df.select(*columns)
