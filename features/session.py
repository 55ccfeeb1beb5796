"""The SparkSession the feature job runs in (local mode unless spark-submit gave a master)."""

from __future__ import annotations

import os
import re
import sys

from pyspark.sql import SparkSession

from features.jvm import session_conf


def local_threads(master: str) -> int | None:
    """Worker threads of a ``local``, ``local[N]`` or ``local[*]`` master (None: a cluster)."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if match is None:
        return None
    threads = match.group(1)
    if threads is None:  # plain "local"
        return 1
    return os.cpu_count() or 1 if threads == "*" else int(threads)


# Settings fixed when the JVM starts: the feature job's own session and the Spark Connect
# server (features.connect_server) both take them.
SERVER_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # the job writes its own _SUCCESS after the stats files
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.parquet.block.size": str(16 << 20),
    # HotSpot does not JIT-compile a method over 8000 bytes of bytecode: a wider stage
    # (the parse and quarantine check of a 40-column day) ran interpreted at 2.3x the time
    "spark.sql.codegen.hugeMethodLimit": "8000",
    # With the UI off the driver still keeps the last 1000 queries' plans, jobs and stages:
    # hundreds of MB for wide plans in a server or session that lives for many days.
    "spark.sql.ui.retainedExecutions": "50",
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.ui.retainedTasks": "10000",
}


def get_spark(
    app_name: str = "recpipe-features", master: str | None = None, remote: str | None = None
) -> SparkSession:
    """Get or create the session.

    With ``remote`` (``sc://host:port``), a Spark Connect session on that server
    (``features.connect_server`` starts one with the settings below): no JVM starts here. Else the
    master is, in order: ``master``, the one spark-submit set, ``$RECPIPE_SPARK_MASTER``,
    ``local[*]``. The driver on ``$SPARK_LOCAL_IP`` (loopback by default), no UI port, UTC. In
    local mode one shuffle partition per worker thread (the job's few aggregations need no
    more); on a cluster Spark's default, which adaptive query execution coalesces.
    """
    if remote is not None:
        return _connect(app_name, remote)
    # the address this host's driver listens on and tells executors (other hosts' on a
    # cluster): $SPARK_LOCAL_IP, loopback by default
    address = os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.driver.host", address)
        .config("spark.driver.bindAddress", address)
        .config("spark.driver.memory", os.environ.get("RECPIPE_SPARK_DRIVER_MEMORY", "2g"))
    )
    for key, value in SERVER_CONF.items():
        builder = builder.config(key, value)
    # spark-submit starts the JVM first, with its --master, and tells PySpark where it listens;
    # a Python-side SparkConf cannot see that master before the session exists
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is not None or not submitted:
        master = master or os.environ.get("RECPIPE_SPARK_MASTER", "local[*]")
        builder = builder.master(master)
    if not submitted:  # recpipe's JVM functions, when built; spark-submit is given them itself
        for key, value in session_conf(local=local_threads(master) is not None).items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    threads = local_threads(spark.sparkContext.master)
    if threads is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(threads))
    spark.sparkContext.setLogLevel(os.environ.get("RECPIPE_SPARK_LOG_LEVEL", "WARN"))
    _quiet_header_checker(spark)
    return spark


def _connect(app_name: str, remote: str) -> SparkSession:
    # a new session each call: its SQL settings are its own on the shared server
    spark = SparkSession.builder.remote(remote).appName(app_name).create()
    threads = local_threads(spark.conf.get("spark.master"))
    if threads is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(threads))
    return spark


def _quiet_header_checker(spark: SparkSession) -> None:
    # features.schema reads one sentinel column more than the header has, on purpose.
    jvm = spark.sparkContext._jvm
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.spark.sql.catalyst.csv.CSVHeaderChecker", jvm.org.apache.logging.log4j.Level.ERROR
    )
