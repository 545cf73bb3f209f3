"""The harness around the worker: what runs a cluster, drives it and checks it, never what serves.

`cluster.py` launches real worker processes, `cluster_client.py` talks to them as a user would,
`loadgen.py` drives load, `load_check.py` checks it at the end, `sync_reader.py` is one user's
recording /sync loop, `history.py`
checks what clients saw (exactly once, in order, tokens monotone), `auth_rules.py` is the Matrix
authorization rules written apart from the worker's as a judge and `auth_replay.py` replays stored
rooms through them, `demo.py` is `fanout demo`,
`upgrade.py` is `fanout upgrade-check` (the previous release, built by `upgrade_build.py`,
upgraded worker by worker under load) and `bench/` holds the benchmarks. A production worker
imports none of this (a test checks it); the harness may import anything.
"""
