# The recpipe image: the pinned stack (requirements.lock), Horovod with Gloo, a Java 17 runtime
# (Spark), and the project with its Spark functions' jar and its TensorFlow kernels. Every
# Airflow component, the Celery worker and the MLflow server of docker-compose.yaml run from it.
#
# Optional inputs for a build behind a proxy or without an index (both folders may be empty):
#   deploy/ca-certificates/*.crt  public CA certificates the proxy's TLS needs (never a key)
#   deploy/wheelhouse/*.whl       wheels pip takes before the index (requirements.lock's)
# PYTHON_IMAGE: the official image, or deploy/local-images/build.sh's stand-in where Docker
# Hub cannot be reached.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

# The stages keep the project's own files apart from the pinned stack, so that a new commit
# rebuilds only its small layers: Docker's classic builder keys `COPY --from` on the source
# stage's image, and a stage that took the checkout would copy the venvs (GBs) again each time.

# the pinned stack: changes with the locks only
FROM ${PYTHON_IMAGE} AS deps
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
COPY requirements.lock requirements-spark-client.lock ./
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
LABEL org.recpipe.stage=deps

# the Spark functions' jar and recpipe's TensorFlow kernels: change with their sources only
FROM deps AS native
ENV PATH=/opt/venv/bin:$PATH
COPY scripts/build_jvm.sh scripts/build_kernels.sh scripts/
COPY features/jvm/ features/jvm/
RUN scripts/build_jvm.sh
COPY trainer/kernels/CMakeLists.txt trainer/kernels/*.cc trainer/kernels/*.h trainer/kernels/
RUN PYTHON=/opt/venv/bin/python scripts/build_kernels.sh
LABEL org.recpipe.stage=native

# the checkout, without the build's inputs (they stay in this stage)
FROM ${PYTHON_IMAGE} AS src
COPY . /opt/recpipe
RUN rm -rf /opt/recpipe/deploy/wheelhouse /opt/recpipe/deploy/ca-certificates
LABEL org.recpipe.stage=src

FROM ${PYTHON_IMAGE}
# openssh-server's package makes host keys as it installs: removed, so that no two pods of any
# deployment share them (an MPIJob worker makes its own as it starts: recpipe.launch.kubeflow)
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless iproute2 procps openssh-client openssh-server \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*
COPY --from=deps /opt/venv /opt/venv
COPY --from=deps /opt/spark-client /opt/spark-client
COPY --from=src /opt/recpipe /opt/recpipe
COPY --from=native /opt/recpipe/build/jvm/ /opt/recpipe/build/jvm/
COPY --from=native /opt/recpipe/build/kernels/librecpipe_kernels.so /opt/recpipe/build/kernels/
WORKDIR /opt/recpipe
# the configs' relative var/ paths (runs_dir, export_dir, model_dir) land on the state volume.
# The services run as user 50000 (compose's AIRFLOW_UID), group 0: what they write (the state
# and Airflow volumes, a named volume taking its directory's owner from here; their home) is
# group 0's too, so that another uid of group 0 writes it as well. The code stays root's.
# MLflow's client reads ~/.mlflow/credentials: the secret compose mounts for the worker.
RUN /opt/venv/bin/pip install -q --no-deps --no-build-isolation -e . \
 && ln -s /var/lib/recpipe /opt/recpipe/var \
 && useradd --uid 50000 --gid 0 --home-dir /home/recpipe --no-create-home --shell /bin/bash recpipe \
 && mkdir -p /var/lib/recpipe /var/lib/airflow /home/recpipe/.mlflow \
 && ln -s /run/secrets/mlflow_credentials /home/recpipe/.mlflow/credentials \
 && chown -R 50000:0 /var/lib/recpipe /var/lib/airflow /home/recpipe \
 && chmod -R g+rwX /var/lib/recpipe /var/lib/airflow /home/recpipe
USER 50000
ARG GIT_COMMIT=unknown
LABEL org.recpipe.stage=final
# HOME and the Hadoop / Spark user: a uid without a passwd entry (another AIRFLOW_UID) runs too
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/recpipe \
    HADOOP_USER_NAME=recpipe \
    SPARK_USER=recpipe \
    RECPIPE_HOME=/opt/recpipe \
    RECPIPE_VAR_DIR=/var/lib/recpipe \
    RECPIPE_GIT_COMMIT=${GIT_COMMIT} \
    RECPIPE_SPARK_CLIENT_PYTHON=/opt/spark-client/bin/python \
    AIRFLOW_HOME=/var/lib/airflow \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/recpipe/dags \
    PYTHONPATH=/opt/recpipe:/opt/recpipe/deploy/airflow
