# The Go toolchain of the machine that runs `idemctl images build --golang`
# (its GOROOT, copied in) on the local Debian base: the build stage of
# deploy/Dockerfile where no golang image can be pulled.
ARG BASE_IMAGE=idem/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates git && \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
# The host's CA bundle: the Go proxy (and anything the build fetches over
# TLS) is trusted exactly as on the host, whose bundle may hold a local CA.
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY go/ /usr/local/go/
ENV PATH=/usr/local/go/bin:/root/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    GOTOOLCHAIN=local
