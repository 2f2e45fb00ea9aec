# Patroni (Debian's package) on the idem/postgres image, for the store's HA
# manager. The entrypoint is patroni; give it its YAML configuration.
ARG BASE_IMAGE=idem/postgres:15
FROM ${BASE_IMAGE}
USER root
RUN apt-get update && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends patroni python3-etcd && \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
USER postgres
EXPOSE 5432 8008
ENTRYPOINT ["/usr/bin/patroni"]
