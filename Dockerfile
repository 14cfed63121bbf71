# gpuwatt image: the collector (and, with the dashboard extra, the web app and alert evaluator).
FROM python:3.11-slim
WORKDIR /opt/gpuwatt
COPY pyproject.toml README.md ./
COPY gpuwatt ./gpuwatt
COPY collector ./collector
COPY dashboard ./dashboard
COPY alerts ./alerts
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/gpuwatt gpuwatt \
    && mkdir -p /var/lib/gpuwatt && chown gpuwatt /var/lib/gpuwatt
USER gpuwatt
ENV GPUWATT_HOME=/var/lib/gpuwatt
ENTRYPOINT []
CMD ["gpuwatt", "--help"]
