# pg2sink with every sink and Spark imports (docker-compose.yml builds it).
#
# The build stage compiles the wheel, with the Kafka sink's C Avro encoder, and fetches
# the PostgreSQL JDBC driver; the image installs the wheel with the extras of every sink
# (kafka, nats, kinesis, duckdb) and spark, and a Java runtime for Spark, so every sink
# and imports work as they do outside Docker.
# No Docker engine runs in CI: tests/test_packaging.py builds a wheel from exactly the
# files this build stage copies, installs it in a fresh virtualenv and streams with it.

FROM python:3.11-slim-bookworm AS build
# gcc for the C extension (setup.py; optional there, so a missing compiler would only
# show as a slower Kafka sink)
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY migrations ./migrations
COPY pg2sink ./pg2sink
RUN pip wheel --no-cache-dir --no-deps -w /dist .
COPY scripts/jdbc_driver.py scripts/services.py ./scripts/
RUN python scripts/jdbc_driver.py --copy-to /jdbc/postgresql.jar

FROM python:3.11-slim-bookworm
# Spark 4 runs on Java 17 and 21; Debian 12 packages 17. The man directory is missing
# from slim images, and the JRE's package scripts need it.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /dist /tmp/dist
RUN pip install --no-cache-dir "$(echo /tmp/dist/pg2sink-*.whl)[kafka,nats,kinesis,duckdb,spark]" \
    && rm -rf /tmp/dist
COPY --from=build /jdbc/postgresql.jar /opt/pg2sink/postgresql.jar
ENV PG2SINK_JDBC_DRIVER=/opt/pg2sink/postgresql.jar
RUN useradd --create-home pg2sink
USER pg2sink
WORKDIR /home/pg2sink
CMD ["pg2sink", "--help"]
