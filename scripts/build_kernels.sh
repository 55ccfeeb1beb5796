#!/usr/bin/env bash
# Builds recpipe's TensorFlow kernels (trainer/kernels) for PYTHON's TensorFlow (default: the
# project's .venv) into build/kernels/librecpipe_kernels.so; cmake rebuilds only what changed.
# TensorFlow's flags are read (configure: an import of TensorFlow) only for a new build dir,
# another Python or another lock. A failure is one line on stderr (the compiler's output in
# build/kernels/build.log), exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"
out=build/kernels
mkdir -p "$out"
want="$py $(cat requirements.lock 2>/dev/null | sha256sum | cut -c1-16)"
configure() {
  if [ ! -f "$out/CMakeCache.txt" ] || [ "$(cat "$out/.configured" 2>/dev/null)" != "$want" ]; then
    rm -f "$out/.configured"  # written again only once the build succeeds
    cmake -S trainer/kernels -B "$out" -DPYTHON="$py" "${launcher[@]}"
  fi
}
# ccache, when installed, compiles a fresh clone's kernels from its cache: paths under the
# project are hashed relative to it (CCACHE_BASEDIR), so every clone shares the entries
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$PWD"
fi
if ! { configure && cmake --build "$out" -j "$(nproc)"; } > "$out/build.log" 2>&1; then
  echo "build_kernels: trainer/kernels did not build with $py's TensorFlow (a C++17 compiler and CMake >= 3.18 are needed): see $out/build.log" >&2
  exit 2
fi
echo "$want" > "$out/.configured"
