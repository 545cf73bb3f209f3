"""The HTTP edge of a worker (aiohttp): the Matrix client-server API (`client_api.py` assembles
`accounts.py`, `rooms.py`, `sync.py`, `admin.py`; `auth.py` finds the requester), the worker-to-worker
routes (`internal.py`, `requests.py`), health and metrics (`health.py`), request bodies (`bodies.py`),
the one JSON error type.

Only transport lives here: parse and refuse bad input, call a handler, shape the answer. Nothing
else in `workers` imports this package except `app.py`, which mounts it; it never imports
`workers.harness`.

The others:

* `account_data.py`: Account data and room tags (`/_matrix/client/v3/user/{userId}/...`)
* `devices.py`: Devices and to-device messages (`/_matrix/client/v3/...`)
* `ephemeral_routes.py`: Typing and presence (`/_matrix/client/v3`): the in-memory streams' client
  endpoints
* `errors.py`: Error responses: every error is the spec's `{"errcode": "M_...", "error": "..."}`
  with a fitting status
* `federation.py`: A stand-in for federation's invite: how a room on another server invites a local
  user
* `federation_client.py`: Asking a remote server for a user's device list: federation's `GET
  /_matrix/federation/v1/user/ devices/{userId}`, at the base URL `remote_servers` names for ...
* `in_flight.py`: The requests a worker is handling, so that shutdown can end them in bounded time
* `keys.py`: Device keys (`/_matrix/client/v3/keys/...`)
* `limits.py`: Request limits at the HTTP layer, answered without a traceback
* `rate_limits.py`: Rate limits that hold across the cluster: one counter per (action, user or
  address) in Redis
* `read_forwarding.py`: Reads on a worker that serves none: relayed to a worker that does, so any
  worker serves any request
* `registration_tokens.py`: Synapse's admin API for registration tokens (`registration: token`), for
  server admins only
* `room_admin.py`: Synapse's Delete Room API, both versions, for server admins
* `room_markers.py`: Where a user has read up to in a room (`/_matrix/client/v3/rooms/{roomId}/...`)
* `timing.py`: HTTP request duration by route: a middleware feeding one Prometheus histogram
"""
