"""Rooms: the write path of a room's events and the rules they follow.

* `writes.py`: `RoomWrites`: sends, createRoom, remote invites and backfill from any worker, run on
  the room's persister
* `forwarded.py`: room writes as they travel between workers (`Written`, `RemoteInvite`)
* `admission.py`: the per-room admission: each write checked against the state the writes it depends
  on left
* `rules.py`: who may send what into a room (`check`), the cached views the rules read
* `room_plan.py`: createRoom's plan: the room's first events, each checked against those before it
* `known_content.py`: the form of the content types the server reads (server ACLs, mentions,
  retention), refused at the client API when wrong
* `stored_checks.py`: the checks of a write that read stored events (a repeated membership, a
  redaction's target, a relation's parent, a canonical alias's aliases), beside the rules
* `relations.py`: what a client may relate (`m.relates_to`): the parent in the room, a reaction
  not repeated (race-free through the admission), a thread not started from a related event
* `canonical_alias.py`: the aliases a room lists lead to it (no room takes another's address)
* `restricted.py`: restricted joins: the allowed rooms' membership checked and the member who
  vouches for the join named, at the client API
* `power_levels.py`: the spec's power levels: who may send, invite, kick, ban and change what
* `history_visibility.py`: who may see which event of a room (read by /sync and /messages too)
* `versions.py`: room versions and the event format each one renders
* `persist.py`: `EventPersister`: concurrent sends batched into one transaction, in the room's order
* `retried_sends.py`: a send retried with its transaction id, answered with the stored event
* `purge.py`, `deletions.py`: a room's end on its writer: the admin purge, the Delete Room API's
  tasks
* `stats.py`: the background task that follows the events stream by its persisted-upto position

Imports `workers.handlers.placement`, `notify` and `caches`; never `sync`, `stored`, `ephemeral`,
`workers.http` nor `workers.harness`.
"""
