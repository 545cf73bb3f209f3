"""Waking readers: who waits for what, and read-your-writes across workers.

* `notifier.py`: `Notifier` (wakes the long-polls a batch concerns) and `DeferredWakes` (holds a
  writer's wakes until its own position covers the batch)
* `visibility.py`: `wait_visible`: a worker that had another write for its client waits until its
  own token covers the write

Imports nothing of the other handler families (they all wake readers through it); never
`workers.http` nor `workers.harness`.
"""
