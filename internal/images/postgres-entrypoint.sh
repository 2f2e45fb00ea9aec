#!/bin/sh
# Entrypoint of the idem/postgres image: initialise PGDATA on first start,
# then run the server in the foreground (extra arguments go to postgres).
set -eu
PGDATA="${PGDATA:-/var/lib/postgresql/data}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw="${POSTGRES_PASSWORD:-}"
  if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then pw="$(cat "$POSTGRES_PASSWORD_FILE")"; fi
  if [ -z "$pw" ]; then
    echo "idem-postgres: set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE (the password of the postgres role)" >&2
    exit 1
  fi
  pwfile="$(mktemp)"
  printf '%s\n' "$pw" > "$pwfile"
  initdb -D "$PGDATA" -U postgres --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 \
    --auth-local=peer --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
  for db in ${POSTGRES_DATABASES:-}; do
    case "$db" in
      *[!a-z0-9_]*|"") echo "idem-postgres: database name $db: only a-z, 0-9 and _" >&2; exit 1 ;;
    esac
    echo "CREATE DATABASE $db" | postgres --single -D "$PGDATA" postgres >/dev/null
  done
  echo "idem-postgres: initialised $PGDATA"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
