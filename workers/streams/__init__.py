"""The concrete replication streams of the worker, one module per stream.

Each module defines its row type, its `pubsub.streams.Stream` (name, row model, update function
reading missed rows from the database) and the constants naming it. A new stream is a new module
here plus its storage and handler. Streams import `pubsub`, `idgen` and `workers.storage`, never
`workers.http`, `workers.handlers` or `workers.harness`.

Its modules:

* `account_data.py`: The `account_data` stream: global account data, room account data and room tags
* `caches.py`: The `caches` stream: batched cache invalidations (see workers.model.StateChanges)
* `device_lists.py`: The `device_lists` stream: whose device list changed, and which remote servers
  to tell
* `events.py`: The `events` stream (live, positive orderings) and the `backfill` stream (historic,
  negative)
* `handovers.py`: What a row of a moved key depends on: the `after` field of the events and stored
  streams' rows
* `memory.py`: Streams kept in memory by their one writer (typing, presence): positions and a
  bounded history
* `presence.py`: The `presence` stream: one row per change of a user's presence, kept in memory by
  its writer
* `receipts.py`: The `receipts` stream: read receipts, with the row grammar of Synapse's receipts
  stream
* `to_device.py`: The `to_device` stream: messages sent straight to devices (`device_inbox`)
* `typing.py`: The `typing` stream: one row per change of a room's typing users, kept in memory by
  its writer
"""
