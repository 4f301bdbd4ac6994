# Tidelog images. Two targets:
#
# - `broker` (the default, last stage): `docker build -t tidelog .` then
#   `docker run -p 127.0.0.1:7410:7410 -v tidelog-data:/data tidelog`.
# - `spark`: the broker's Python packages plus a Java runtime, pyspark and the examples, for
#   Spark jobs and the demo producer: `docker build --target spark -t tidelog-spark .` then
#   `docker run --network host tidelog-spark examples/windowed_counts.py`.
#
# Inside the container, and only there, the broker listens on 0.0.0.0 (gRPC 7410,
# Prometheus metrics 7411) so that published ports reach it. Data lives in the /data
# volume. `docker stop` sends SIGTERM: the broker stops cleanly within shutdown.grace.ms
# (5 s by default, under Docker's 10 s before SIGKILL); after a SIGKILL the next start
# recovers and every acks=all record is there.
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml setup.py README.md pyspark_tidelog.py ./
COPY storage/ storage/
COPY proto/ proto/
COPY broker/ broker/
COPY client/ client/
COPY spark_sink/ spark_sink/
COPY tidelog/ tidelog/
# gcc builds the optional C codec (storage/_native.c) and leaves again; without it the
# image would run the pure-Python codec, several times slower.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install . \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y \
    && rm -rf /var/lib/apt/lists/* \
    && (cd / && python -c "import tidelog.storage._native") \
    && useradd --system --uid 10001 --create-home tidelog \
    && mkdir -p /data \
    && chown tidelog /data

# --- Spark jobs: a JRE for the Spark JVM, pyspark/pyarrow/pandas, the examples ---------
# (and psycopg2, the `cdc` extra: the CDC connector and examples/cdc run from this image)
FROM base AS spark

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && pip install ".[spark,cdc]" \
    && mkdir -p /checkpoints \
    && chown tidelog /checkpoints
COPY examples/ examples/
# PySpark's Python workers must run this interpreter (the data source's module is
# installed in it). Checkpoints go to /checkpoints (a volume in docker-compose.yml).
ENV PYSPARK_PYTHON=python \
    CHECKPOINT_DIR=/checkpoints
USER tidelog
ENTRYPOINT ["python"]
CMD ["examples/windowed_counts.py"]

# --- the broker (default target) ---------------------------------------------------------
FROM base AS broker

USER tidelog
WORKDIR /data
VOLUME ["/data"]
EXPOSE 7410 7411

HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "tidelog.broker", "healthcheck", "--address", "127.0.0.1:7410"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "tidelog.broker", "serve"]
CMD ["--listen", "0.0.0.0:7410", "--data-dir", "/data", "--set", "metrics.host=0.0.0.0", "--set", "metrics.port=7411"]
