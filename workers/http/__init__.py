"""The HTTP edge of a worker (aiohttp): routes, request bodies, the one JSON error type.

Only transport lives here: parse and refuse bad input, call a handler, shape the answer. Nothing
else in `workers` imports this package except `app.py`, which mounts it; it never imports
`workers.harness`.
"""
