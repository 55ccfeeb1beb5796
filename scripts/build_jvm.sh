#!/usr/bin/env bash
# Build build/jvm/recpipe-spark.jar (features/jvm/src) against the venv's Spark jars; seconds,
# and nothing when the jar is newer than its sources. Without javac the feature job uses
# Spark's own expressions instead (the same values, slower): see features/jvm.py.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*" >&2; }
jar=build/jvm/recpipe-spark.jar
src=features/jvm/src
# rebuilt when a source or the pinned Spark (requirements.lock) is newer than the jar
if [ -f "$jar" ] && [ -z "$(find "$src" requirements.lock -newer "$jar" \( -name '*.java' -o -name '*.lock' \))" ]; then
  exit 0
fi
if ! command -v javac >/dev/null; then
  say "javac is missing: the feature job uses Spark's own expressions (slower). Install a JDK:"
  say "  sudo apt-get install -y openjdk-17-jdk-headless"
  exit 0
fi
py=.venv/bin/python
[ -x "$py" ] || py=python3  # the image installs the stack without a venv
spark_jars=$("$py" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
javac --release 17 -Xlint:all,-path -Werror -cp "$spark_jars/*" -d "$classes" $(find "$src" -name '*.java')
mkdir -p "$(dirname "$jar")"
jar cf "$jar.tmp" -C "$classes" .
mv "$jar.tmp" "$jar"  # a reader never sees half a jar
say "built $jar"
