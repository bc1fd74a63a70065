# The callgate image: one image for `callgate materialize`, `callgate dashboard`, `callgate demo` and
# `callgate coverage` (compose.yaml runs it with a different command per service).
#
#   docker build -t callgate:0.1.0 .
#   docker run --rm callgate:0.1.0 --help
#
# The project is installed without its dev extra (no test tools, no framework integrations).

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid/gid, so that a bind-mounted store directory can be given to it (chown 10001:10001).
RUN groupadd --system --gid 10001 callgate \
    && useradd --system --uid 10001 --gid callgate --create-home --home-dir /home/callgate callgate \
    && mkdir -p /data \
    && chown callgate:callgate /data

WORKDIR /opt/callgate
# Only what the distribution is built from (.dockerignore keeps the rest out of the context as well).
COPY pyproject.toml README.md ./
COPY interceptor_core ./interceptor_core
COPY events ./events
COPY consumers ./consumers
COPY dashboard ./dashboard
COPY callgate ./callgate
RUN pip install . && cd / && rm -rf /opt/callgate

USER callgate
WORKDIR /data
# The audit store lives here (`--db /data/audit.duckdb`); a named volume keeps it across containers.
VOLUME ["/data"]

# 8765: the materializer's read API; 8501: the dashboard.
EXPOSE 8765 8501

# The materializer's /healthz (200 while it consumes, 503 once its loop has failed); urlopen raises on
# anything but 2xx. Other commands (dashboard, demo) replace or disable this check in compose.yaml.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/healthz', timeout=4)"]

ENTRYPOINT ["callgate"]
CMD ["--help"]
