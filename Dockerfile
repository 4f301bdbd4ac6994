# Tidelog broker image: `docker build -t tidelog .` then
# `docker run -p 127.0.0.1:7410:7410 -v tidelog-data:/data tidelog`.
#
# Inside the container, and only there, the broker listens on 0.0.0.0 (gRPC 7410,
# Prometheus metrics 7411) so that published ports reach it. Data lives in the /data
# volume. `docker stop` sends SIGTERM: the broker stops cleanly within shutdown.grace.ms
# (5 s by default, under Docker's 10 s before SIGKILL); after a SIGKILL the next start
# recovers and every acks=all record is there.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY storage/ storage/
COPY proto/ proto/
COPY broker/ broker/
COPY client/ client/
COPY spark_sink/ spark_sink/
RUN pip install . \
    && useradd --system --uid 10001 --no-create-home tidelog \
    && mkdir -p /data \
    && chown tidelog /data

USER tidelog
WORKDIR /data
VOLUME ["/data"]
EXPOSE 7410 7411

HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "broker", "healthcheck", "--address", "127.0.0.1:7410"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "broker", "serve"]
CMD ["--listen", "0.0.0.0:7410", "--data-dir", "/data", "--set", "metrics.host=0.0.0.0"]
