"""The fanout worker: the application built on `idgen` (stream IDs, tokens) and `pubsub` (replication).

One process runs one `Worker` (`app.py`) whose role comes from its configuration alone (`config.py`):
it persists a stream when listed among that stream's writers, serves reads unless `serve_reads` is
false, and runs the background tasks it names. The domain lives here and nowhere else:

| module / package | holds |
|---|---|
| `app.py` | a worker's life: start (each phase timed), serve, drain, stop |
| `config.py` | the settings model (YAML + `FANOUT_*` variables) and its one loader |
| `model.py`, `routing.py` | events, state changes and invalidations; which writer owns a room |
| `identifiers.py` | Matrix user ids, room ids, aliases and event types, as the spec's grammar allows them |
| `worker_metrics.py` | the Prometheus series a worker feeds itself |
| `services.py` | the embedded PostgreSQL and Redis for tools, tests and the demo |
| `event_loop.py`, `gc_tuning.py` | which asyncio loop runs; the garbage collector's thresholds |
| `storage/` | migrations and one module of SQL per domain |
| `streams/` | the concrete streams (one module per stream: the place a new stream goes) |
| `handlers/` | persisting, syncing, caches, notifier, room rules, background tasks |
| `http/` | the HTTP edge: routes, bodies, errors |
| `cli/` | the `fanout` command, one module per subcommand |
| `harness/` | cluster launcher, load generator, history checker, demo, benchmarks |

A production worker never imports `workers.harness` (a test checks it) nor `analytics`.
"""
