# PostgreSQL 15 from Debian's packages, on the local Debian base made by
# `idemctl images build` (debootstrap + docker import): nothing is pulled.
# The entrypoint creates the cluster on first start with the password from
# POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE, creates the databases named in
# POSTGRES_DATABASES, and serves on every interface with
# scram-sha-256 password authentication.
ARG BASE_IMAGE=idem/debian:bookworm
FROM ${BASE_IMAGE}
# Debian's postgresql-common would create a "main" cluster on install; the
# entrypoint makes its own in PGDATA instead.
RUN mkdir -p /etc/postgresql-common/createcluster.d && \
    echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/idem.conf && \
    apt-get update && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 && \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin && \
    install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data && \
    install -d -o postgres -g postgres -m 2775 /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/idem-postgres
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data \
    LANG=C.UTF-8
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/idem-postgres"]
