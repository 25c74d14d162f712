# Build stage: the project wheel plus wheels for every dependency, so the final stage needs no
# network and no build tools.
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Hatchling force-includes sql/ into the wheel as worker/sql, and reads README.md for the metadata.
COPY pyproject.toml README.md ./
COPY sql/ sql/
COPY worker/ worker/
RUN pip wheel --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Not --system: system accounts are numbered below 1000, and useradd warns at a uid outside that range.
RUN groupadd --gid 10001 webhook \
 && useradd --uid 10001 --gid webhook --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin webhook
# A bind mount keeps the wheels out of the image's layers; the build stage made one wheel of the
# project, whatever its version (worker/__init__.py has it), so it is named by its file.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels /wheels/webhook_worker-*.whl
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# Probes and /metrics (http.port).
EXPOSE 8080
# Liveness only: /health stays 200 while the database is down, as a restart would not help.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)"]
# The config file is mounted at run time (ConfigMap or bind mount) and DATABASE_URL comes from the
# environment: nothing environment-specific or secret lives in the image.
ENTRYPOINT ["webhook-worker"]
CMD ["--config", "/etc/webhook-worker/config.yaml"]
