# The recpipe image: the pinned stack (requirements.lock), Horovod with Gloo, a Java 17 JDK
# (Spark, and javac for recpipe's Spark functions), and the project. Every Airflow component,
# the Celery worker and the MLflow server of docker-compose.yaml run from it.
FROM python:3.11.7-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless build-essential cmake git curl \
    openssh-server openssh-client \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/recpipe
COPY requirements.lock requirements-spark-client.lock pyproject.toml ./
# Spark Connect's client for the feature job apart: it needs protobuf 6, TensorFlow 2.18 < 6
RUN python -m venv /opt/spark-client \
 && /opt/spark-client/bin/pip install --no-cache-dir -r requirements-spark-client.lock
RUN pip install --no-cache-dir -r requirements.lock \
 && pip install --no-deps --force-reinstall pyspark==4.3.0 \
 && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
    pip install --no-cache-dir --no-build-isolation horovod==0.28.1

COPY . .
RUN pip install --no-cache-dir --no-deps -e . && scripts/build_jvm.sh

ARG GIT_COMMIT=unknown
ENV RECPIPE_HOME=/opt/recpipe \
    RECPIPE_VAR_DIR=/var/lib/recpipe \
    RECPIPE_GIT_COMMIT=${GIT_COMMIT} \
    RECPIPE_SPARK_CLIENT_PYTHON=/opt/spark-client/bin/python \
    AIRFLOW_HOME=/var/lib/airflow \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/recpipe/dags \
    PYTHONPATH=/opt/recpipe:/opt/recpipe/deploy/airflow
