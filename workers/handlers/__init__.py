"""What a worker does with requests and replicated rows, by family (each package's docstring maps
its modules and says what it may import):

* `caches/`: the in-memory caches of the database, the caches stream's bookkeeping
* `notify/`: waking long-polls; read-your-writes across workers
* `placement/`: which writer writes a key now (leases), and a write's way there from any worker
* `rooms/`: a room's write path: rules, admission, the batching persister, versions, a room's end
* `stored/`: the stored streams: account data, device lists, one-time keys, to-device, receipts
* `ephemeral/`: typing and presence
* `sync/`: the reads: /sync and /messages

The families import one way, from the bottom of this order up: `caches`, `notify`, `placement`,
`rooms`, `stored`, `sync` (`ephemeral` beside `rooms`, on `caches` and `placement`); a test
checks it. Each handler is a plain class or function set that takes its I/O (a pool, a
generator, a callback) from its caller, so it can be tested on its own. Handlers never import
`workers.http` (the edge calls them, not the other way round), `workers.assembly`, `workers.app`
nor `workers.harness`; no module sits directly in this package.
"""
