# InstantStart: dashboard, REST API and operation engine on port 3099.
# Build: docker build -t instantstart .   Run: docker run -p 127.0.0.1:3099:3099 -v is-data:/data instantstart

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY app ./app
COPY panels ./panels
COPY services ./services
COPY mcp_bridge ./mcp_bridge
COPY sandbox ./sandbox
RUN /opt/venv/bin/pip install --no-cache-dir .

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="instantstart" \
      org.opencontainers.image.description="Control plane for SageMaker HyperPod on EKS" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /home/app --create-home app \
    && mkdir -p /data && chown app:app /data && chmod 0700 /data
COPY --from=build /opt/venv /opt/venv
COPY skills /opt/instantstart/skills
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    INSTANTSTART_DATA_DIR=/data \
    INSTANTSTART_HOST=0.0.0.0 \
    INSTANTSTART_PORT=3099
USER 10001:10001
WORKDIR /home/app
VOLUME ["/data"]
EXPOSE 3099
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:3099/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["instantstart"]
CMD ["serve"]
