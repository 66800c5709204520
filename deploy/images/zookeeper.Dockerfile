# Stand-in for zookeeper:3.9 from Debian's zookeeper (3.8): one standalone server on 2181 with
# its data in /data and /datalog, the four-letter words of ZOO_4LW_COMMANDS_WHITELIST, and
# zkServer.sh on the PATH for the healthcheck (zookeeper-entrypoint writes the config).
ARG BASE
FROM ${BASE}
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends zookeeper \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data /datalog
ENV PATH=/usr/share/zookeeper/bin:$PATH
COPY zookeeper-entrypoint /usr/local/bin/zookeeper-entrypoint
EXPOSE 2181
ENTRYPOINT ["zookeeper-entrypoint"]
