"""The harness around the worker: what runs a cluster, drives it and checks it, never what serves.

`cluster.py` launches real worker processes, `cluster_client.py` talks to them as a user would,
`loadgen.py` drives load, `load_check.py` checks it at the end, `sync_reader.py` is one user's
recording /sync loop, `history.py`
checks what clients saw (exactly once, in order, tokens monotone), `auth_rules.py` is the Matrix
authorization rules written apart from the worker's as a judge and `auth_replay.py` replays stored
rooms through them and through Synapse's own rules (`synapse_auth_judge.py`, run in Synapse's
virtualenv), `demo.py` is `fanout demo`,
`upgrade.py` is `fanout upgrade-check` (the previous release, built by `upgrade_build.py`,
upgraded worker by worker under load) and `bench/` holds the benchmarks. A production worker
imports none of this (a test checks it); the harness may import anything.

The others:

* `backup.py`: Backup and restore of the database, command for command as docs/operations.md gives
  them
* `chaos.py`: The fault scenarios' report: each scenario appends one line of JSON, `make chaos`
  prints the table
* `churn.py`: The load's membership churn: which moves a user, or the room's owner on them, may make
  from each membership, in the rooms the load makes
* `compat.py`: Record this release's replication lines and sync tokens, for the next release's
  compatibility tests: `python -m workers.harness.compat --out tests/compat ...
* `faultproxy.py`: A TCP proxy on loopback that tests and `make chaos` use to cut, delay, throttle
  or silence a link
* `gap_fill.py`: Filling a limited timeline's gap as a Matrix client does: a /sync answer whose room
  timeline says `limited: true` left out events before its first one; the ...
* `laggard.py`: Laggards: clients that sync rarely (a phone in a pocket, woken now and then) with a
  small timeline limit in their filter (`room.timeline.limit`), so that a ...
* `load_mix.py`: What the load's clients did that a well-behaved test client does not, counted for
  the summary: racing membership pairs and their outcomes, readers moving ...
* `membership_races.py`: Racing membership changes to one user, sent at the same time through
  different workers, and their check
* `memory.py`: An ID generator held in memory: per-writer positions only, no database
* `pg_messages.py`: The messages a PostgreSQL client sends, split out of its byte stream, for the
  fault proxy's rules
* `pgbouncer_server.py`: A throw-away PgBouncer in transaction mode in front of a PostgreSQL, on a
  free loopback port
* `race_load.py`: The load's racing membership changes (`workers.harness.membership_races` holds the
  pairs, the rules and the check): a pair of changes to one user, sent at the ...
* `redis_cluster_faults.py`: Faults of a Redis Cluster, done for real: a slot migrated to another
  shard, a primary killed
* `written.py`: What the writers have written, read from the database, and whether a reader's
  token reached it (where the load waits for its readers)
* `containers/`: `make containers`: the stack's images built here and its containers run on a real
  Docker engine
"""
