# Stand-in for postgres:16 from Debian's postgresql (15): the same POSTGRES_USER / _PASSWORD / _DB
# variables, data directory and pg_isready as the official image (postgres-entrypoint).
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/run/postgresql && chown postgres:postgres /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint /usr/local/bin/postgres-entrypoint
# Fast shutdown: open transactions are rolled back, then the server stops cleanly.
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["postgres-entrypoint"]
