"""`fanout bench peer`: Synapse 1.163.2 beside fanout, on the same servers, with the same driver.

Modules:

* `synapse_build.py`: matrix-synapse in a virtualenv of its own under `.cache/synapse-peer/`.
* `synapse_config.py`: homeserver.yaml and the workers' files (loopback ports, Redis, rate limits).
* `synapse_processes.py`: starting and stopping main, two event persisters and a sync worker.
* `targets.py`: fanout, Synapse and the bare server behind one shape (where each path goes).
* `driver.py`: the client code both systems get (saturation; a steady rate seen by long-polls).
* `sends.py`: the saturation's senders, each on one raw HTTP/1.1 keep-alive connection.
* `cpu.py`: CPU seconds of process groups from /proc.
* `run.py`: the command: the ceiling, rounds alternated between the systems, the figures.
"""

from workers.harness.bench.peer.run import figures, main

__all__ = ["figures", "main"]
