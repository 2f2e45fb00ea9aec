# The idem image: static idemd, idemctl, etcd and etcdctl (CGO_ENABLED=0,
# built on the host by `idemctl images build` from the versions pinned in
# go.mod), the CA certificates, and nothing else. No shell: health checks
# are HTTP (idemd /healthz and /readyz, etcd /health).
FROM scratch
COPY etc/ /etc/
COPY tmp/ /tmp/
COPY --chown=65532:65532 var/ /var/
COPY bin/ /usr/local/bin/
ENV PATH=/usr/local/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /var/lib/idem
EXPOSE 8080 2379 2380
ENTRYPOINT ["/usr/local/bin/idemd"]
