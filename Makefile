# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv and install
# what they need (re-installing only when pyproject.toml changes).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JDBC_JAR ?= /usr/share/java/postgresql.jar

.PHONY: demo test lint bench venv jdbc clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[embedded,audit,dev]'
	touch $(STAMP)

venv: $(STAMP)

# The Spark audit reads Postgres over JDBC; Debian's libpostgresql-jdbc-java provides the driver.
jdbc:
	@test -f $(JDBC_JAR) || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing the PostgreSQL JDBC driver (libpostgresql-jdbc-java)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java >/dev/null); \
	  else \
	    echo "missing $(JDBC_JAR): run 'sudo apt-get install libpostgresql-jdbc-java' or set JDBC_JAR=path"; exit 1; \
	  fi; }

demo: $(STAMP) jdbc
	$(BIN)/fanout demo

test: $(STAMP) jdbc
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check idgen pubsub workers analytics tests
	$(BIN)/ruff format --check idgen pubsub workers analytics tests
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/fanout bench idgen
	$(BIN)/fanout bench pubsub
	$(BIN)/fanout bench cluster

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
