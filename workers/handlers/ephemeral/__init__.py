"""The ephemeral streams: typing and presence, kept in memory by their writer.

* `typing.py`, `typing_service.py`: the writer's typing state with timeouts; a worker's typing
  operations
* `presence.py`, `presence_service.py`: the presence writer's tracker and every worker's view; a
  worker's presence operations
* `presence_sync.py`: a sync worker's count of the /sync requests in flight per device

Imports `workers.handlers.caches` and `placement` (forwarding); never `rooms`, `stored`, `sync`,
`workers.http` nor `workers.harness`.
"""
