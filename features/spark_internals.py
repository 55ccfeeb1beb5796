"""Everything recpipe's JVM functions (``features/jvm/src``) use of Spark's internal API, in one
list, and the check that a running Spark still has it.

Catalyst's ``Expression``, its code generation and ``AccumulatorContext`` are not a public API:
a Spark release may rename or change any of them. ``scripts/build_jvm.sh`` compiles the jar
against the venv's Spark (a change that breaks the sources fails the build, and the job then
runs without the jar); ``missing`` catches what compiles but no longer links, at runtime
(``features.jvm.registered`` falls back to Spark's own expressions: the same values, slower),
and ``tests/features/test_spark_internals.py`` fails with the list when an upgrade changes it.
A new use of an internal class in the Java sources belongs in ``INTERNAL_API`` first.

Retried and recomputed stages: the day's figures are accumulator updates made while the write
reads the rows (``DayFiguresTap``; the fallback, Spark's observed metrics, is accumulator-based
too). Spark merges a task's accumulator updates only when the task succeeds, and those of a
result stage once per partition, so a task that fails and is retried (``spark.task.maxFailures``)
or a speculative copy counts its rows once. A shuffle-map stage recomputed after a lost executor
would add its rows again; the feature job's tapped stage is the write's result stage (the frame
has no shuffle after the tap), so its figures stay exact.
"""

from __future__ import annotations

SPARK_VERSION = "4.3.0"  # the release these were last checked against (requirements.lock)

# class -> public members (methods, and for a constructor "<init>/N": its parameter count)
INTERNAL_API: dict[str, tuple[str, ...]] = {
    "org.apache.spark.sql.SparkSessionExtensions": ("injectFunction",),
    "org.apache.spark.sql.catalyst.FunctionIdentifier": ("apply",),
    "org.apache.spark.sql.catalyst.InternalRow": (),
    "org.apache.spark.sql.catalyst.expressions.Expression": (
        "eval",
        "genCode",
        "doGenCode",
        "deterministic",
        "nullable",
        "dataType",
        "children",
        "withNewChildrenInternal",
        "prettyName",
    ),
    "org.apache.spark.sql.catalyst.expressions.ExpressionInfo": ("<init>/3",),
    "org.apache.spark.sql.catalyst.expressions.Literal": ("value",),
    "org.apache.spark.sql.catalyst.expressions.objects.StaticInvoke": ("<init>/9",),
    "org.apache.spark.sql.catalyst.expressions.codegen.CodeBlock": ("<init>/2",),
    "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator": (
        "javaType",
        "calculateParamLengthFromExprValues",
        "isValidParamLength",
    ),
    "org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext": (
        "addReferenceObj",
        "freshName",
        "addNewFunction",
    ),
    "org.apache.spark.sql.catalyst.expressions.codegen.ExprCode": ("<init>/3", "code", "isNull", "value"),
    "org.apache.spark.sql.catalyst.expressions.codegen.ExprValue": (),
    "org.apache.spark.sql.catalyst.expressions.codegen.JavaCode": ("isNullVariable", "variable"),
    "org.apache.spark.sql.catalyst.util.SQLOrderingUtil": ("compareDoubles",),
    "org.apache.spark.unsafe.types.UTF8String": ("fromString", "trim"),
    "org.apache.spark.util.AccumulatorContext": ("get",),
    "org.apache.spark.util.AccumulatorV2": ("isZero", "copy", "reset", "add", "merge", "value", "id"),
}


def missing(jvm) -> list[str]:
    """What of ``INTERNAL_API`` the JVM behind ``jvm`` (a py4j ``JVMView``:
    ``spark.sparkContext._jvm``) lacks, as ``class`` or ``class.member`` strings; [] when all
    is there. Looked up by reflection, without running any of it."""
    out = []
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    for name, members in INTERNAL_API.items():
        try:
            cls = jvm.java.lang.Class.forName(name, False, loader)
        except Exception:  # py4j wraps ClassNotFoundException
            out.append(name)
            continue
        methods = {m.getName() for m in cls.getMethods()} | {m.getName() for m in cls.getDeclaredMethods()}
        arities = {c.getParameterCount() for c in cls.getConstructors()}
        for member in members:
            if member.startswith("<init>/"):
                found = int(member.removeprefix("<init>/")) in arities
            else:
                found = member in methods
            if not found:
                out.append(f"{name}.{member}")
    return out
