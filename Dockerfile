# gpuwatt image: one image for every service (collector, dashboard, alert evaluator).
# GPUWATT_EXTRAS are the extras installed: the dashboard's web stack is what the dashboard service
# needs; the collector and the evaluator need only the core. tests/test_deploy_image.py installs the
# same extras from the same files into a fresh venv and starts every compose service's command.
FROM python:3.11-slim
ARG GPUWATT_EXTRAS=dashboard
WORKDIR /opt/gpuwatt
COPY pyproject.toml README.md ./
COPY gpuwatt ./gpuwatt
COPY collector ./collector
COPY dashboard ./dashboard
COPY alerts ./alerts
RUN pip install --no-cache-dir ".[${GPUWATT_EXTRAS}]" \
    && useradd --system --uid 10001 --user-group --home /var/lib/gpuwatt gpuwatt \
    && mkdir -p /var/lib/gpuwatt && chown gpuwatt /var/lib/gpuwatt
# A fixed uid, so that Kubernetes can run it as runAsUser: 10001 (deploy/kubernetes/).
USER 10001
ENV GPUWATT_HOME=/var/lib/gpuwatt \
    PYTHONUNBUFFERED=1
ENTRYPOINT []
CMD ["gpuwatt", "--help"]
