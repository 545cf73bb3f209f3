"""The fanout worker: the application built on `idgen` (stream IDs, tokens) and `pubsub` (replication).

One process runs one `Worker` (`app.py`) whose role comes from its configuration alone (`config.py`):
it persists a stream when listed among that stream's writers, serves reads unless `serve_reads` is
false, and runs the background tasks it names. The domain lives here and nowhere else:

* `app.py`: a worker's life: start (each phase timed), serve, drain, stop
* `config.py`: the settings model (YAML + `FANOUT_*` variables), its one loader, who writes which
  stream
* `model.py`, `routing.py`: events, state changes and invalidations; which writer owns a room or a
  user
* `identifiers.py`, `redaction_rules.py`: Matrix identifiers as the spec's grammar allows them; what
  survives a redaction
* `errors.py`: the one base of the worker's deliberate errors
* `handlers/`: what a worker does with requests and rows, by family (sync, rooms, placement, stored,
  ...)
* `assembly/`: what ties the handlers to replication and HTTP: the ordering rule, the stored and
  ephemeral streams' wiring, the SIGHUP reload
* `process/`: a process's plumbing: instance lease, start-up and shutdown, probes, logs, metrics
* `storage/`: migrations and one module of SQL per domain
* `streams/`: the concrete streams (one module per stream: the place a new stream goes)
* `http/`: the HTTP edge: routes, bodies, errors
* `cli/`: the `fanout` command, one module per subcommand
* `embedded/`: throw-away PostgreSQL, Redis and Redis Cluster servers for tools, tests and the demo
* `harness/`: cluster launcher, load generator, history checker, demo, benchmarks

A production worker never imports `workers.harness` (a test checks it) nor `analytics`.
"""
