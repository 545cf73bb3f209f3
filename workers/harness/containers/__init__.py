"""`make containers`: the stack's images built here and its containers run on a real Docker engine.

`commands.py` runs the engine's and Compose's command lines (a step's output to its log, a failure
as one line), `engine.py` finds the Docker engine or starts `dockerd`, `base.py` makes the Debian
bookworm base with debootstrap from this machine's apt sources and imports it, `images.py` builds
the stack's images on it, `stack.py` is one Compose project of the stack (ports, health, restarts),
`promises.py` checks what an image and a running container promise, `scenario.py` is the whole
run (load, crashes, restarts, stop, up again) and `__main__.py` its command line. Harness only: a
worker never imports it.
"""
