#!/bin/sh
# `redis-server OPTIONS...` as the public image runs it: Debian's server with container.conf first.
exec /usr/bin/redis-server /etc/redis/container.conf "$@"
