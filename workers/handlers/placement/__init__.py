"""Placement: which writer writes a key now, and how a write gets there from any worker.

* `leases.py`: key leases with epochs (a row per key, fenced by the holder's instance lease), the
  hand-over wait
* `room_leases.py`: the rooms' kind of key lease, held by the room's persister
* `routed.py`: a write run on its key's writer, wherever that is now, retried while the key moves
* `forwarding.py`: what handlers need to hand an operation to its owner (`Forwarder`, its errors)
* `stream_writes.py`: the stored streams' writes from any worker (per user, receipts per room)

Imports `workers.handlers.notify` and the worker's plumbing (`workers.process`, `routing`,
`storage`); never another handler family, `workers.http` nor `workers.harness`.
"""
