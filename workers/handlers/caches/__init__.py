"""Caches: what a worker keeps in memory of the database, and the caches stream's bookkeeping.

* `lru.py`: `LruCache` (bounded, safe against a load that races an invalidation) and `SyncCaches`,
  the set every reader keeps (rooms of a user, members, current state, visibility, access tokens)
* `change_cache.py`: `StreamChangeCache`: which entities a stream changed lately, so /sync skips
  queries
* `applied.py`: the record of what this worker applied from the caches stream (the audit reconciles
  it)
* `retention.py`: the background task that prunes the invalidation log by age

The lowest family: it imports `workers.model` and `workers.storage` only, never another handler
family, `workers.http` nor `workers.harness`.
"""
