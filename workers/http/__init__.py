"""The HTTP edge of a worker (aiohttp): the Matrix client-server API (`client_api.py` assembles
`accounts.py`, `rooms.py`, `sync.py`, `admin.py`; `auth.py` finds the requester), the worker-to-worker
routes (`internal.py`, `requests.py`), health and metrics, request bodies, the one JSON error type.

Only transport lives here: parse and refuse bad input, call a handler, shape the answer. Nothing
else in `workers` imports this package except `app.py`, which mounts it; it never imports
`workers.harness`.
"""
