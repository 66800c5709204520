# Stand-in for redis:7 from Debian's redis-server (7.0): the compose file gives the command
# (redis-server with AOF and the ACL file); data under /data as in the official image.
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data
WORKDIR /data
EXPOSE 6379
CMD ["redis-server"]
