#!/bin/sh
# First start: a cluster whose postgres user has POSTGRES_PASSWORD, and the POSTGRES_DB database.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA"
  printf '%s\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" > /tmp/pwfile
  # UTF8 as the official image has it (a bare Debian base has no locale: initdb would pick SQL_ASCII)
  initdb -D "$PGDATA" -U postgres --encoding=UTF8 --locale=C.UTF-8 --pwfile=/tmp/pwfile --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f /tmp/pwfile
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ] && createdb -U postgres "$POSTGRES_DB"
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
if [ "$1" = postgres ]; then
  shift
  exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
