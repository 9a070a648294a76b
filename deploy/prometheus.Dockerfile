# Prometheus from Debian's package (no image registry needed beyond a Debian base). The compose
# files mount the scrape configuration over /etc/prometheus/prometheus.yml.
ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/*
USER prometheus
EXPOSE 9090
ENTRYPOINT ["prometheus", "--config.file=/etc/prometheus/prometheus.yml", \
  "--storage.tsdb.path=/var/lib/prometheus/metrics2", "--web.listen-address=0.0.0.0:9090"]
