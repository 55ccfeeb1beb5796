"""``recpipe predict``: score a table of rows with a SavedModel export, EasyRec's flags.

In one process by default (the input streamed, bounded memory); with ``--master`` on Spark
(local mode or a cluster), the same scoring in its Python workers, for a day that outgrows one
machine. The model is ``--saved_model_dir`` (an export version, or the export directory: its
newest version) or ``--model_name`` with ``--alias`` (MLflow's registry: the version the alias
names, default ``champion``). Paths stay inside the project's data roots (``recpipe.paths``).
Exit codes: ``recpipe.errors`` (2 for a bad flag, path, column or value: one line naming it).
"""

from __future__ import annotations

import codecs
import json
import os

from predict.files import COMMAND
from recpipe import outputs as owned
from recpipe.arguments import ArgumentParser, at_least
from recpipe.errors import UsageError
from recpipe.paths import confine

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _char(flag: str):
    def parse(text: str) -> str:
        value = codecs.decode(text, "unicode_escape")  # "\t", "\\u0001" as EasyRec's docs write them
        if len(value) != 1:
            raise UsageError(f"{flag}={text!r}: one character (escapes such as \\t or \\u0001 allowed)")
        return value

    return parse


def _flag_bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise UsageError(f"--with_header={text!r}: true or false")
    return text.lower() in ("true", "1")


def parser() -> ArgumentParser:
    """The command's flags (EasyRec's ``easy_rec.python.predict`` names where it has one)."""
    p = ArgumentParser(
        prog="recpipe predict",
        description="Score rows with a SavedModel export: CSV or Parquet in, Parquet or CSV out, "
        "EasyRec's probs / logits beside the reserved columns. The output directory is written "
        "whole (part files and _SUCCESS) or not at all.",
    )
    p.add_argument(
        "--input_path", required=True, help="a file or a partition directory of CSV or Parquet files"
    )
    p.add_argument(
        "--output_path", required=True,
        help="the output directory: a new one, or this command's earlier output of the same input "
        "(replaced whole); never a data root, the input or a directory holding it",
    )  # fmt: skip
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--saved_model_dir", help="an export version, or an export directory (its newest version)"
    )
    model.add_argument("--model_name", help="a registered model: score with the version --alias names")
    p.add_argument("--alias", default="champion", help="with --model_name: the alias (default champion)")
    p.add_argument(
        "--tracking_uri", default=None, help="with --model_name: MLflow (recpipe.tracking's order)"
    )
    p.add_argument(
        "--reserved_cols",
        default="ALL_COLUMNS",
        help="input columns copied to the output: ALL_COLUMNS, a list, or ''",
    )
    p.add_argument(
        "--output_cols",
        default="ALL_COLUMNS",
        help="outputs and types: ALL_COLUMNS or 'probs double,logits float'",
    )
    p.add_argument("--batch_size", type=at_least(1), default=1024, help="rows per call of the model")
    p.add_argument(
        "--input_sep",
        type=_char("--input_sep"),
        default=None,
        help="CSV input's separator (default: the model's data_config.separator)",
    )
    p.add_argument(
        "--output_sep",
        type=_char("--output_sep"),
        default="\x01",
        help="CSV output's separator (default \\u0001)",
    )
    p.add_argument(
        "--with_header", type=_flag_bool, nargs="?", const=True, default=None,
        help="CSV input has a header line (default: the model's data_config.with_header)",
    )  # fmt: skip
    p.add_argument("--selected_cols", default=None, help="input columns to read, names or 0-based positions")
    p.add_argument(
        "--input_format", choices=("csv", "parquet"), default=None, help="default: by the files' suffix"
    )
    p.add_argument("--output_format", choices=("csv", "parquet"), default=None, help="default: the input's")
    p.add_argument("--master", default=None, help="score on Spark with this master (local[N], spark://...)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``recpipe predict``; print one JSON line ``{"rows", "files", "columns",
    "saved_model", "output_path"}``."""
    args = parser().parse_args(argv)
    input_path = confine(args.input_path, "--input_path")
    output_path = confine(args.output_path, "--output_path")
    owned.check(output_path, COMMAND, [input_path])  # before TensorFlow's import: refused in a second
    from predict.local import PredictOptions  # TensorFlow: after the flags are checked

    if args.saved_model_dir is not None:
        saved = confine(args.saved_model_dir, "--saved_model_dir")
    else:
        from predict.model import registered_export
        from recpipe import tracking

        saved = confine(
            registered_export(tracking.client(args.tracking_uri), args.model_name, args.alias), "export_path"
        )
    options = PredictOptions(
        reserved_cols=args.reserved_cols, output_cols=args.output_cols, batch_size=args.batch_size,
        input_sep=args.input_sep, output_sep=args.output_sep, with_header=args.with_header,
        selected_cols=args.selected_cols, input_format=args.input_format, output_format=args.output_format,
    )  # fmt: skip
    if args.master is None:
        from predict.local import predict_files
        from predict.model import ScoringModel

        result = predict_files(ScoringModel(saved), input_path, output_path, options)
    else:
        from features.session import get_spark
        from predict.spark import predict_on_spark

        spark = get_spark("recpipe-predict", master=args.master)
        try:
            result = predict_on_spark(spark, saved, input_path, output_path, options)
        finally:
            spark.stop()
    print(json.dumps({**result, "output_path": str(output_path)}))
    return 0


if __name__ == "__main__":
    from recpipe.errors import run_command

    raise SystemExit(run_command(main, "recpipe predict"))
