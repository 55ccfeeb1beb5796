"""The feature job's session settings (no Spark started)."""

import os

import pytest

from features.session import local_threads


@pytest.mark.parametrize(
    ("master", "threads"),
    [
        ("local", 1),
        ("local[3]", 3),
        ("local[4,2]", 4),  # local[N, maxFailures]
        ("local[*]", os.cpu_count()),
        ("spark://10.0.0.5:7077", None),
        ("yarn", None),
        ("k8s://https://kube:443", None),
    ],
)
def test_shuffle_partitions_follow_the_local_threads_and_stay_spark_s_on_a_cluster(master, threads):
    assert local_threads(master) == threads
