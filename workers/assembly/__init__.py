"""What `workers.app.Worker` is built of, beyond the handlers: the pieces that tie them to each
other, to replication and to the HTTP edge.

* `batch_order.py`: the ordering rule's callbacks: invalidate the caches, advance the generator,
  wake the readers
* `stored.py`: the stored streams of a worker (account data, device lists, to-device, receipts),
  wired
* `ephemeral.py`: typing, presence and worker requests, wired into the worker and its routes
* `reload.py`: SIGHUP: the configuration read again, the writers and the instance map changed online
* `generators.py`: the ID generators of the events, backfill and caches streams
* `client_app.py`: the HTTP edge: the client API with its collaborators, the worker routes, the
  listeners
* `health.py`: /health and readiness, from in-memory state only

May import every handler family, `workers.http` (the routes it installs) and `workers.process`;
never `workers.app` (it reads the worker through protocols) nor `workers.harness`.
"""
