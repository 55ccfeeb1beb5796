"""Batch prediction in one process: each input file streamed in batches of ``batch_size`` rows
through the SavedModel and written to a part file of its own, so memory stays bounded whatever
the input's size; the output directory appears whole (``recpipe.atomic``) or not at all."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from predict.columns import output_columns, reserved_columns, selected_columns
from predict.files import COMMAND, BadInputError, data_files, file_format
from predict.model import ScoringModel, output_schema, scored
from recpipe import outputs as owned

CSV_BLOCK_BYTES = 4 << 20


@dataclass(frozen=True)
class PredictOptions:
    """EasyRec's ``predict`` flags (see ``predict.cli``); ``None``: the model's ``data_config``."""

    reserved_cols: str = "ALL_COLUMNS"
    output_cols: str = "ALL_COLUMNS"
    batch_size: int = 1024
    input_sep: str | None = None
    output_sep: str = "\x01"
    with_header: bool | None = None
    selected_cols: str | None = None
    input_format: str | None = None  # csv | parquet; None: by the files' suffix
    output_format: str | None = None  # csv | parquet; None: as the input


def csv_names(file: Path, sep: str, with_header: bool, model: ScoringModel) -> list[str]:
    """The columns of a CSV file: its header line, or the model's ``data_config.input_fields``."""
    if not with_header:
        return list(model.field_order)
    with open(file, encoding="utf-8", newline="") as f:
        return f.readline().rstrip("\r\n").split(sep)


def read_batches(
    file: Path, fmt: str, batch_size: int, names: list[str] | None, sep: str, with_header: bool,
    selected: list[str] | None,
) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """``file``'s rows in batches of ``batch_size`` (the last one shorter); CSV values as text.

    Raises:
        BadInputError: a CSV row with another number of columns, or an unreadable file.
    """
    try:
        if fmt == "parquet":
            yield from pq.ParquetFile(file).iter_batches(batch_size=batch_size, columns=selected)
            return
        reader = pacsv.open_csv(
            file,
            read_options=pacsv.ReadOptions(
                column_names=None if with_header else names, block_size=CSV_BLOCK_BYTES
            ),
            parse_options=pacsv.ParseOptions(delimiter=sep),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in names or []}, include_columns=selected,
                strings_can_be_null=False,
            ),
        )  # fmt: skip
        yield from rebatch(reader, batch_size)
    except (pa.ArrowInvalid, OSError) as err:
        raise BadInputError(f"{file}: {str(err).splitlines()[0]}") from None


def rebatch(batches, size: int) -> Iterator[pa.RecordBatch]:
    """Record batches of exactly ``size`` rows (the last one shorter) from batches of any size."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        while batch.num_rows:
            take = min(size - held, batch.num_rows)
            pending.append(batch.slice(0, take))
            held += take
            batch = batch.slice(take)
            if held == size:
                yield _joined(pending)
                pending, held = [], 0
    if held:
        yield _joined(pending)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _writer(path: Path, fmt: str, schema: pa.Schema, sep: str):
    if fmt == "parquet":
        return pq.ParquetWriter(path, schema)
    options = pacsv.WriteOptions(include_header=False, delimiter=sep, quoting_style="none")
    return pacsv.CSVWriter(path, schema, write_options=options)


def predict_files(model: ScoringModel, input_path: str | os.PathLike, output_path: str | os.PathLike,
                  options: PredictOptions) -> dict:  # fmt: skip
    """Score every row under ``input_path`` into ``output_path`` (a directory of part files, one
    per input file, and ``_SUCCESS``): a new directory, or this command's earlier output from the
    same input, replaced whole (``recpipe.outputs``).

    Returns:
        ``{"rows", "files", "columns", "saved_model"}``: rows written (= rows read).

    Raises:
        BadInputError: no input, a missing column, a value of the wrong type, a bad flag for
            this input (nothing is written then).
        recpipe.outputs.OutputNotOwnedError: ``output_path`` is a root, holds or lies in the
            input, or holds what this command did not write from this input.
    """
    files = data_files(input_path)
    fmt = file_format(files, options.input_format)
    out_fmt = options.output_format or fmt
    sep = model.separator if options.input_sep is None else options.input_sep
    header = model.with_header if options.with_header is None else options.with_header
    rows = 0
    columns: list[str] = []
    with owned.directory(output_path, COMMAND, [input_path]) as tmp:
        for i, file in enumerate(files):
            names = csv_names(file, sep, header, model) if fmt == "csv" else pq.read_schema(file).names
            selected = selected_columns(options.selected_cols, names)
            first = 0
            writer = None
            part = tmp / f"part-{i:05d}.{out_fmt}"
            try:
                for batch in read_batches(file, fmt, options.batch_size, names, sep, header, selected):
                    if writer is None:
                        outputs = output_columns(options.output_cols, model.outputs)
                        outputs_named = [n for n, _ in outputs]
                        reserved = reserved_columns(options.reserved_cols, batch.schema.names, outputs_named)
                        schema = output_schema([batch.schema.field(c) for c in reserved], outputs)
                        writer = _writer(part, out_fmt, schema, options.output_sep)
                        columns = schema.names
                    rows_out = scored(model, batch, reserved, outputs, str(file), first)
                    try:
                        writer.write_batch(rows_out)
                    except pa.ArrowInvalid as err:  # CSV: a value holding the separator or a newline
                        raise BadInputError(
                            f"{file} rows {first + 1}-{first + batch.num_rows}: {str(err).splitlines()[0]}; "
                            "choose another --output_sep or --output_format parquet"
                        ) from None
                    first += batch.num_rows
            finally:
                if writer is not None:
                    writer.close()
            rows += first
        (tmp / "_SUCCESS").write_text("")
    return {"rows": rows, "files": len(files), "columns": columns, "saved_model": str(model.directory)}
