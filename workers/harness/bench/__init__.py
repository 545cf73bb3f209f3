"""Benchmarks: each prints its figures beside a ceiling measured in the same run on the same machine.

`_common.py` holds what they share (timer, the one percentile rule, progress lines, scratch
databases, the result table); each other module is one `fanout bench NAME`.

The others:

* `_processes.py`: Benchmark processes behind pipes: spawned once (no inherited event loop), reused
  by every run
* `all.py`: `fanout bench all`: every benchmark in turn, then one JSON file and docs/benchmarks.md
  from them
* `audit.py`: `fanout bench audit`: rows/s of the audit's core aggregate on Spark, beside Postgres
  computing the same
* `bare_asgi.py`: The bare server's rooms (`bare_sync.BareRooms`) as a plain ASGI application, run
  on uvicorn (with httptools and uvloop) or on granian: the per-request cost of ...
* `bare_server.py`: The bare server (`bare_sync.BareRooms`) as a process of its own, the long-poll
  benchmarks' ceiling
* `bare_sync.py`: A bare server speaking just enough of /sync and send to be the long-poll
  benchmarks' ceiling
* `cluster.py`: `fanout bench cluster`: what the worker cluster sustains, beside a raw ceiling
  measured in the same run
* `cpu_sampler.py`: Where a worker's CPU time goes: a sampling profiler on the process's own CPU
  clock (what `--profile` runs the workers under)
* `crowd.py`: `fanout bench crowd`: one sync worker holding a crowd of re-issued long-polls, woken
  room by room
* `demo.py`: `fanout bench demo`: the demo's mixed load, as `make demo` drives it, measured as a
  benchmark
* `http.py`: `fanout bench http`: Matrix sends over HTTP, driven by wrk, beside a bare aiohttp
  handler
* `idgen.py`: `fanout bench idgen`: MultiWriterIdGenerator throughput beside a plain asyncpg
  ceiling, and start-up time
* `idle.py`: `fanout bench idle`: what the demo's cluster costs per second when nobody uses it
* `instructions.py`: `fanout bench instructions`: CPU instructions per persisted and per received
  event, by callgrind
* `live.py`: `fanout bench live`: sends at fixed offered rates, each seen by a reader long-polling a
  sync worker
* `longpoll.py`: `fanout bench longpoll`: one sync worker holding many idle `/sync` long-polls, then
  waking a room
* `poll_clients.py`: Long-polling clients in processes of their own, as Matrix clients behave: each
  `/sync` re-issued with the `next_batch` it returned, as soon as it returns
* `profile.py`: CPU profiles of worker processes during a benchmark, and their summary
* `process_sockets.py`: Which process holds a TCP connection: its local ports, read from /proc
* `pubsub.py`: `fanout bench pubsub`: replication throughput and latency beside the raw redis-py
  ceiling
* `pubsub_subscribers.py`: The subscriber side of `fanout bench pubsub`: processes that read the
  bench stream, raw or ours
* `ratelimit.py`: `fanout bench ratelimit`: what a cluster-wide rate-limit check costs, beside what
  it guards
* `room_setup.py`: Users and rooms for the long-poll benchmarks, made through the client API as
  clients make them
* `scale.py`: `fanout bench scale`: what one event costs in each process kind as writers,
  subscribers and streams grow
* `scale_roles.py`: The processes of `fanout bench scale`: writers and subscribers, ours and raw
  redis-py, one a process
* `visible.py`: Where an event becomes visible, seen from a process of its own (the latency phase of
  `bench cluster`)
* `write_path.py`: The write path's two sides for `fanout bench cluster` and `fanout bench
  instructions`, in child processes
* `peer/`: `fanout bench peer`: Synapse 1.163.2 beside fanout, on the same servers, with the same
  driver
"""
