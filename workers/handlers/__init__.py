"""What a worker does with requests and replicated rows: persist, sync, cache, notify, check room rules.

Each handler is a plain class or function set that takes its I/O (a pool, a generator, a callback)
from its caller, so it can be tested on its own. Handlers never import `workers.http` (the edge
calls them, not the other way round) nor `workers.harness`.
"""
