# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv and install
# what they need (re-installing only when pyproject.toml changes).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JDBC_JAR ?= /usr/share/java/postgresql.jar

.PHONY: demo test upgrade-check previous-release synapse-peer lint bench chaos scale venv jdbc redis-server pgbouncer docker-compose wrk audit-zip clean lock containers dockerd debootstrap

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[embedded,audit,dev,bench]'
	touch $(STAMP)

venv: $(STAMP)

# requirements.lock: the runtime dependencies of a non-dev install, pinned, from a clean venv.
lock:
	rm -rf $(VENV)-lock && $(PYTHON) -m venv $(VENV)-lock
	$(VENV)-lock/bin/pip install -q .
	{ echo "# The non-dev install, pinned (make lock): what the image and CI install."; \
	  $(VENV)-lock/bin/pip freeze --exclude fanout; } > requirements.lock
	rm -rf $(VENV)-lock

# The Spark audit reads Postgres over JDBC; Debian's libpostgresql-jdbc-java provides the driver.
jdbc:
	@test -f $(JDBC_JAR) || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing the PostgreSQL JDBC driver (libpostgresql-jdbc-java)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java >/dev/null); \
	  else \
	    echo "missing $(JDBC_JAR): run 'sudo apt-get install libpostgresql-jdbc-java' or set JDBC_JAR=path"; exit 1; \
	  fi; }

# The TLS test needs a TLS-capable Redis (the bundled Valkey has no TLS): Debian's redis-server,
# installed without starting its service (policy-rc.d), only when missing and only as root.
redis-server:
	@command -v redis-server >/dev/null || [ -n "$$REDIS_SERVER_BIN" ] || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing redis-server (for the TLS test)"; \
	    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null); \
	    status=$$?; rm -f /usr/sbin/policy-rc.d; exit $$status; \
	  else \
	    echo "missing redis-server: run 'sudo apt-get install redis-server' or set REDIS_SERVER_BIN"; exit 1; \
	  fi; }

# The PgBouncer test runs a real pooler in transaction mode: Debian's pgbouncer, installed without
# starting its service (policy-rc.d), only when missing and only as root; PGBOUNCER_BIN names another.
pgbouncer:
	@command -v pgbouncer >/dev/null || [ -n "$$PGBOUNCER_BIN" ] || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing pgbouncer (for the PgBouncer test)"; \
	    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null); \
	    status=$$?; rm -f /usr/sbin/policy-rc.d; exit $$status; \
	  else \
	    echo "missing pgbouncer: run 'sudo apt-get install pgbouncer' or set PGBOUNCER_BIN"; exit 1; \
	  fi; }

# The compose test validates compose/docker-compose.yml with the real Compose tooling: Debian's
# docker-compose package, installed only when missing and only as root.
docker-compose:
	@command -v docker-compose >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing docker-compose (to validate compose/docker-compose.yml)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null); \
	  else \
	    echo "missing docker-compose: run 'sudo apt-get install docker-compose'"; exit 1; \
	  fi; }

# The Docker engine for `make containers`: Debian's docker.io, installed only when missing and only as root.
dockerd:
	@command -v dockerd >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing docker.io (the Docker engine, for make containers)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null); \
	  else \
	    echo "missing dockerd: run 'sudo apt-get install docker.io'"; exit 1; \
	  fi; }

# The containers' base image is made with Debian's debootstrap: installed only when missing and only as root.
debootstrap:
	@command -v debootstrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing debootstrap (to make the containers' Debian base image)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null); \
	  else \
	    echo "missing debootstrap: run 'sudo apt-get install debootstrap'"; exit 1; \
	  fi; }

# The release check of the containers (docs/operations.md, "Running in containers"): starts dockerd
# (as root) when no engine runs, makes the Debian base and builds the images (cached by content),
# runs the stack with docker-compose under the demo's load, crashes and restarts, stops it and
# starts it again; every step prints its figure. About 6 minutes cached, 10 from nothing.
CONTAINERS_ACTIONS ?= 1500
containers: $(STAMP) docker-compose dockerd debootstrap
	$(BIN)/python -m workers.harness.containers --actions $(CONTAINERS_ACTIONS)

demo: $(STAMP) jdbc
	$(BIN)/fanout demo

test: $(STAMP) jdbc redis-server pgbouncer docker-compose previous-release synapse-peer
	$(BIN)/pytest -q -n 2 --dist loadgroup

# The previous release (release/previous.toml's commit) in its own venv under .cache/upgrade-check,
# built once (about a minute: its pinned dependencies from PyPI or pip's cache), reused after.
previous-release: $(STAMP)
	$(BIN)/python -m workers.harness.upgrade --build-only

# Synapse 1.163.2, the peer of `fanout bench peer`, in its own venv under .cache/synapse-peer (never a
# dependency of this project): built once (about half a minute here, pip's cache off), reused after.
synapse-peer: $(STAMP)
	$(BIN)/fanout bench peer --build-only

# That release as a cluster under load, upgraded worker by worker to this tree; then the history
# check, the clients that started over and the phases' table (docs/operations.md, "Upgrading").
UPGRADE_PHASE_S ?= 10
upgrade-check: $(STAMP)
	$(BIN)/python -m workers.harness.upgrade --phase-seconds $(UPGRADE_PHASE_S)

# The fault scenarios with larger loads and longer outages than CI (tests/cluster/test_scenarios.py),
# then their table: scenario, events acknowledged and checked, lost, duplicated, reordered, recovery.
CHAOS_SCALE ?= 5
chaos: $(STAMP)
	@mkdir -p out && rm -f out/chaos.jsonl
	FANOUT_CHAOS_SCALE=$(CHAOS_SCALE) FANOUT_CHAOS_REPORT=out/chaos.jsonl $(BIN)/pytest -q tests/cluster/test_scenarios.py
	$(BIN)/python -m workers.harness.chaos out/chaos.jsonl

# Redis Cluster: every test that runs on one (the fault scenarios five times larger), then
# fanout bench scale, whose table docs/scaling.md quotes (about 10 minutes: docs/testing.md).
scale: $(STAMP)
	@mkdir -p out && rm -f out/chaos-cluster.jsonl
	FANOUT_CHAOS_SCALE=$(CHAOS_SCALE) FANOUT_CHAOS_REPORT=out/chaos-cluster.jsonl $(BIN)/pytest -q -m redis_cluster
	$(BIN)/python -m workers.harness.chaos out/chaos-cluster.jsonl
	$(BIN)/fanout bench scale | tee out/scale.txt

lint: $(STAMP)
	$(BIN)/ruff check idgen pubsub workers analytics tests
	$(BIN)/ruff format --check idgen pubsub workers analytics tests
	$(BIN)/mypy

# The HTTP benchmark's load generator: Debian's wrk (C, epoll), so Python is never the client's limit.
wrk:
	@command -v wrk >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing wrk (the HTTP load generator of fanout bench http)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null); \
	  else \
	    echo "missing wrk: run 'sudo apt-get install wrk'"; exit 1; \
	  fi; }

# Every benchmark, then docs/benchmarks.md and out/bench/all.json from the run (tens of minutes).
bench: $(STAMP) jdbc wrk
	$(BIN)/fanout bench all

# The audit package for spark-submit --py-files (docs/audit.md): every module of analytics/, no caches.
audit-zip: dist/analytics.zip
dist/analytics.zip: $(wildcard analytics/*.py) analytics/log4j2.properties
	$(PYTHON) analytics/bundle.py $@

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache dist
