"""The concrete replication streams of the worker, one module per stream.

Each module defines its row type, its `pubsub.streams.Stream` (name, row model, update function
reading missed rows from the database) and the constants naming it. A new stream is a new module
here plus its storage and handler. Streams import `pubsub`, `idgen` and `workers.storage`, never
`workers.http`, `workers.handlers` or `workers.harness`.
"""
