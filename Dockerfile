# The recpipe image: the pinned stack (requirements.lock), Horovod with Gloo, a Java 17 runtime
# (Spark), and the project with its Spark functions' jar. Every Airflow component, the Celery
# worker and the MLflow server of docker-compose.yaml run from it.
#
# Optional inputs for a build behind a proxy or without an index (both folders may be empty):
#   deploy/ca-certificates/*.crt  public CA certificates the proxy's TLS needs (never a key)
#   deploy/wheelhouse/*.whl       wheels pip takes before the index (requirements.lock's)
# PYTHON_IMAGE: the official image, or deploy/local-images/build.sh's stand-in where Docker
# Hub cannot be reached.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless build-essential cmake git ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY deploy/ca-certificates/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_FIND_LINKS=/wheelhouse \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY deploy/wheelhouse/ /wheelhouse/
WORKDIR /opt/recpipe
COPY requirements.lock requirements-spark-client.lock pyproject.toml ./
# Spark Connect's client for the feature job apart: it needs protobuf 6, TensorFlow 2.18 < 6
RUN python -m venv /opt/spark-client \
 && /opt/spark-client/bin/pip install -q -r requirements-spark-client.lock
# the lock is complete (--no-deps); pyspark-client's files would overwrite pyspark's
RUN python -m venv /opt/venv \
 && grep -v '^pyspark-client==' requirements.lock > /tmp/lock \
 && /opt/venv/bin/pip install -q --no-deps -r /tmp/lock \
 && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
    /opt/venv/bin/pip install -q --no-deps --no-build-isolation horovod==0.28.1
COPY . .
# the build's inputs stay in this stage
RUN rm -rf deploy/wheelhouse deploy/ca-certificates
ENV PATH=/opt/venv/bin:$PATH
RUN pip install -q --no-deps --no-build-isolation -e . && scripts/build_jvm.sh

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless iproute2 procps openssh-client openssh-server \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/spark-client /opt/spark-client
COPY --from=build /opt/recpipe /opt/recpipe
WORKDIR /opt/recpipe
# the configs' relative var/ paths (runs_dir, export_dir, model_dir) land on the state volume
RUN ln -s /var/lib/recpipe /opt/recpipe/var
ARG GIT_COMMIT=unknown
ENV PATH=/opt/venv/bin:$PATH \
    RECPIPE_HOME=/opt/recpipe \
    RECPIPE_VAR_DIR=/var/lib/recpipe \
    RECPIPE_GIT_COMMIT=${GIT_COMMIT} \
    RECPIPE_SPARK_CLIENT_PYTHON=/opt/spark-client/bin/python \
    AIRFLOW_HOME=/var/lib/airflow \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/recpipe/dags \
    PYTHONPATH=/opt/recpipe:/opt/recpipe/deploy/airflow
