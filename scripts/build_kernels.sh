#!/usr/bin/env bash
# Builds recpipe's TensorFlow kernels (trainer/kernels) for PYTHON's TensorFlow (default: the
# project's .venv) into build/kernels/librecpipe_kernels.so; cmake rebuilds only what changed.
# A failure is one line on stderr (the compiler's output in build/kernels/build.log), exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
out=build/kernels
mkdir -p "$out"
if ! { cmake -S trainer/kernels -B "$out" -DPYTHON="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" \
       && cmake --build "$out" -j "$(nproc)"; } > "$out/build.log" 2>&1; then
  echo "build_kernels: trainer/kernels did not build with $py's TensorFlow (a C++17 compiler and CMake >= 3.18 are needed): see $out/build.log" >&2
  exit 2
fi
