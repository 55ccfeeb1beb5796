#!/usr/bin/env bash
# One-command setup, idempotent: .venv with exactly requirements.lock, Horovod built with
# Gloo against that TensorFlow, the project installed editable, and .venv/spark-client (the
# feature job's Spark Connect client). Seconds when nothing is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*" >&2; }

if ! java -version 2>&1 | grep -qE 'version "17'; then
  say "Spark 4 needs Java 17 and 'java' is $(command -v java || echo missing)."
  say "Install it with: sudo apt-get update && sudo apt-get install -y openjdk-17-jre-headless"
  exit 1
fi

# Debian packages a test needs, installed when setup runs as root with apt-get: name, the
# file it brings, what needs it
apt_package() {
  [ -x "$2" ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian's $1 ($3)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null; }
  else
    say "$1 is missing: sudo apt-get install -y $1 ($3; its tests are skipped without it)"
  fi
}
# the UI test renders Airflow's grid in Chromium (driven by Playwright from the lock)
apt_package chromium /usr/bin/chromium "the Airflow UI test"
# the MPIJob workers' sshd in the multi-host tests (never started as a service here)
apt_package openssh-server /usr/sbin/sshd "Horovod jobs across hosts"
# the compose test: a Docker engine (dev.dockerd starts it), Compose, and debootstrap for the
# local images where Docker Hub cannot be reached (docs/deployment.md)
apt_package docker.io /usr/sbin/dockerd "the compose test"
apt_package docker-compose /usr/bin/docker-compose "the compose test"
apt_package debootstrap /usr/sbin/debootstrap "the compose test's local images"
# optional (a fresh clone's kernels from the cache): installed as root, never asked for
[ "$(id -u)" = 0 ] && apt_package ccache /usr/bin/ccache "kernel builds of a fresh clone from the cache"

# make test and the stream demo talk to PostgreSQL and Redis on 127.0.0.1: say how to get them
# (setup itself goes on without them)
if ! { command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; } \
   && ! psql -h 127.0.0.1 -U postgres -tAc 'select 1' >/dev/null 2>&1; then
  say "no PostgreSQL on 127.0.0.1:5432 with a password-free 'postgres' user: make test needs it"
  say "  (sudo apt-get install -y postgresql, then allow trust for 127.0.0.1 in pg_hba.conf)"
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/6379 && printf 'PING\r\n' >&3 && read -r -t 2 reply <&3 \
      && [[ $reply == +PONG* ]]) 2>/dev/null; then
  say "no Redis on 127.0.0.1:6379: make test and make demo-stream need it (sudo apt-get install -y redis-server)"
fi

stamp=.venv/.recpipe-setup
want=$(cat requirements.lock requirements-spark-client.lock pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
# the project's bytecode, ahead: with PYTHONDONTWRITEBYTECODE set no process writes it, and
# every one (a task, a job process) would compile the modules it imports again
compile_project() { .venv/bin/python -m compileall -q -j 0 dags dev features operators recpipe trainer >/dev/null; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  scripts/build_jvm.sh
  scripts/build_kernels.sh
  compile_project
  exit 0
fi

PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  command -v "$PY" >/dev/null || { say "Python 3.11 ($PY) not found; set PYTHON=/path/to/python3.11"; exit 1; }
  say "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# uv installs the locks from its cache in seconds where pip takes minutes (a fresh clone's
# setup, CI's included); bytecode compiled up front, since no process writes it later. pip
# stays for horovod's build, which needs this .venv's TensorFlow.
UV_VERSION=0.13.9
if [ "$(.venv/bin/uv --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  pip install "uv==$UV_VERSION"
fi
uv_install() { .venv/bin/uv pip install -q --compile-bytecode --python "$@"; }

say "installing requirements.lock"
# the lock is complete: no resolver (--no-deps), and without pyspark-client, which
# apache-airflow-providers-apache-spark asks for and whose files would overwrite pyspark's
# (pyspark holds Spark Connect's client too)
uv_install .venv/bin/python --no-deps -r <(grep -v '^pyspark-client==' requirements.lock)
# an older .venv may still hold pyspark-client's files over pyspark's
want_spark=$(grep -E '^pyspark==' requirements.lock | cut -d= -f3)
if [ "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')" != "$want_spark" ]; then
  say "re-installing pyspark $want_spark over pyspark-client's files"
  uv_install .venv/bin/python --no-deps --reinstall "pyspark==$want_spark"
fi
[ "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')" = "$want_spark" ]

if ! .venv/bin/python -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  say "building horovod 0.28.1 with Gloo (2-4 minutes the first time; pip caches the wheel)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
    pip install --no-build-isolation horovod==0.28.1
fi

pip install --no-deps --no-build-isolation -e .

# Spark Connect's client, which prepare_features runs in (operators/feature_job.py): pyspark
# 4.3's connect protocol needs protobuf >= 6.33.5, which tensorflow 2.18.1 refuses.
if [ ! -x .venv/spark-client/bin/python ]; then
  say "creating .venv/spark-client (Spark Connect's client, requirements-spark-client.lock)"
  "$PY" -m venv --without-pip .venv/spark-client  # uv installs into it; pip is not needed
fi
# complete too: without the resolver, which costs about 40 s of index lookups
uv_install .venv/spark-client/bin/python --no-deps -r requirements-spark-client.lock
scripts/build_jvm.sh
say "building trainer/kernels (C++, against .venv's TensorFlow)"
scripts/build_kernels.sh
compile_project
echo "$want" > "$stamp"
say "ready: $(.venv/bin/python --version), .venv/bin/recpipe"
