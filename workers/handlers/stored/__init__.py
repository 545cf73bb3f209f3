"""The stored streams: per-user (and per-room) data kept in PostgreSQL and replicated as streams.

* `account_data.py`: a user's global and per-room account data, and room tags
* `device_lists.py`: every change to a user's devices, on the user's device_lists writer
* `one_time_keys.py`: one-time and fallback keys: uploads, claims, counts read where exact
* `to_device.py`: to-device messages, delivered in the recipient device's /sync
* `receipts.py`: read receipts, written on the room's receipts writer
* `federation_sender.py`: the background stand-in that consumes what writers queue for remote
  servers

Imports `workers.handlers.placement`, `rooms` (a member's membership) and `caches`; never `sync`,
`ephemeral`, `workers.http` nor `workers.harness`.
"""
