"""A worker process's plumbing: what any long-running fanout process needs, whatever its role.

* `instance_lease.py`: one process per instance name: a lease row with an epoch (the fence every
  write checks)
* `startup_retry.py`, `startup_errors.py`: start-up connections retried for a bounded window; each
  expected failure as one line and an exit code
* `connect.py`: the first steps: PostgreSQL, Redis and the migrations, each retried
* `shutdown.py`: the shutdown steps under one deadline (`shutdown_timeout_s`)
* `reachability.py`: a background PostgreSQL probe, so /health answers without a query
* `connection_budget.py`: PostgreSQL's connection budget against `max_connections`
* `position_hints.py`: the start-up check of the Redis position hints against the sequences
* `previous_release.py`: whether workers of the previous release run (compatibility mode)
* `event_loop.py`, `gc_tuning.py`: which asyncio loop runs; the garbage collector's thresholds
* `log_format.py`, `metrics.py`: log lines (text or JSON); the Prometheus series a worker feeds
* `redact.py`: secrets out of what a command prints

Imports `workers.config`, `errors`, `routing` and `storage` only; never the handlers, the assembly,
`workers.http` nor `workers.harness`.
"""
