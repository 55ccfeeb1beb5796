"""The serving graph is stock TensorFlow: an export loads and scores in a fresh process that
imports nothing of the project (EasyRec's users meet "Op type not registered" in TF Serving when
a custom op slips into the graph), every op of its graph and functions is one stock TensorFlow
registers, and it scores the rows as the project's own process does, within 1e-6."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

PROJECT = ("recpipe", "trainer", "features", "operators", "predict", "cli", "dags", "dev", "tests")

# run with ``python -I`` (no working directory or PYTHONPATH on sys.path): stock TensorFlow only
CHILD = r"""
import json, sys
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

export, out, PROJECT_PACKAGES = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
model = tf.saved_model.load(export)
fn = model.signatures["serving_default"]
ops = set()
graph = fn.graph.as_graph_def()
for node in graph.node:
    ops.add(node.op)
for f in graph.library.function:
    ops.update(n.op for n in f.node_def)
unknown = sorted(op for op in ops if op_def_registry.get(op) is None)
rng = np.random.default_rng(0)
N = 16
inputs = {}
for name, spec in fn.structured_input_signature[1].items():
    shape = [N if d is None and i == 0 else (d if d is not None else 3) for i, d in enumerate(spec.shape)]
    if spec.dtype == tf.string:
        value = np.array([f"v{x}" for x in rng.integers(0, 50, int(np.prod(shape)))]).reshape(shape)
    elif spec.dtype.is_integer:
        value = rng.integers(0, 50, shape).astype(spec.dtype.as_numpy_dtype)
    elif spec.dtype == tf.bool:
        value = rng.integers(0, 2, shape).astype(bool)
    else:
        value = rng.normal(size=shape).astype(spec.dtype.as_numpy_dtype)
    inputs[name] = value
scores = {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in inputs.items()}).items()}
project = sorted(m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES)
np.savez(out + ".inputs.npz", **inputs)
np.savez(out + ".scores.npz", **scores)
json.dump({"ops": len(ops), "unknown": unknown, "project": project}, open(out, "w"))
"""


def check_stock_serving(export: Path, workdir: Path) -> dict:
    """Load and score ``export`` (a SavedModel version directory) in a fresh stock-TensorFlow
    process, score the same inputs here, and assert the three claims of the module docstring.

    Returns:
        ``{"ops": distinct ops in the graph, "outputs": output names}``.
    """
    import tensorflow as tf

    out = workdir / f"stock-{export.parent.name}-{export.name}.json"
    done = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, str(export), str(out), ",".join(PROJECT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["unknown"] == [], (export, report["unknown"])
    assert report["project"] == [], (export, report["project"])
    with np.load(str(out) + ".inputs.npz") as f:
        inputs = {k: f[k] for k in f.files}
    with np.load(str(out) + ".scores.npz") as f:
        theirs = {k: f[k] for k in f.files}
    fn = tf.saved_model.load(str(export)).signatures["serving_default"]
    ours = {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in inputs.items()}).items()}
    assert ours.keys() == theirs.keys()
    for name in ours:
        if ours[name].dtype.kind == "f":
            np.testing.assert_allclose(ours[name], theirs[name], atol=1e-6, err_msg=f"{export} {name}")
        else:
            np.testing.assert_array_equal(ours[name], theirs[name], err_msg=f"{export} {name}")
    return {"ops": report["ops"], "outputs": sorted(ours)}


def saved_models(root: Path) -> list[Path]:
    """Every SavedModel version directory under ``root`` (those holding ``saved_model.pb``)."""
    return sorted(p.parent for p in Path(root).rglob("saved_model.pb") if not p.parent.name.startswith("."))
