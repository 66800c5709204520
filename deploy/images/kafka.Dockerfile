# Stand-in for apache/kafka:4.1.1: the same Kafka (the host's kafka-broker jar set, fetched from
# Maven Central by scripts/bootstrap: shared/jar_sets.toml) on Debian's Java 17 instead of the
# official image's Java 21, with the official image's interface: every KAFKA_* variable a line of
# server.properties, CLUSTER_ID for the storage's first format, data in /var/lib/kafka/data,
# KAFKA_HEAP_OPTS for the JVM, bash for the healthcheck (kafka-entrypoint).
ARG BASE
FROM ${BASE}
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/kafka/data /opt/kafka/config
COPY jars /opt/kafka/libs
COPY kafka-log4j2.properties /opt/kafka/config/log4j2.properties
COPY kafka-entrypoint /usr/local/bin/kafka-entrypoint
EXPOSE 9092
VOLUME ["/var/lib/kafka/data"]
ENTRYPOINT ["kafka-entrypoint"]
