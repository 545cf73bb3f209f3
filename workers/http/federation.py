"""A stand-in for federation's invite: how a room on another server invites a local user.

`PUT /_matrix/federation/v2/invite/{roomId}/{eventId}` with federation's body
`{"room_version", "event": {m.room.member invite}, "invite_room_state": [stripped state]}` answers
`{"event": {...}}`. The cluster speaks no federation: there are no server keys to check, so
instead of an X-Matrix signature the request carries `Authorization: Bearer <worker_secret>`
(what a test federation peer of the cluster holds). The invite is stored on the room's persister
(`RoomWrites.remote_invite`): the room's version, the state the invite showed, and the invite
event, which reaches the invitee's /sync. The invitee accepts it later with `/join`, which works
because the room's version was kept; a version this server does not speak is refused at once
(400 M_INCOMPATIBLE_ROOM_VERSION).
"""

from __future__ import annotations

import hmac

from aiohttp import web

from workers import identifiers
from workers.handlers.rooms.forwarded import RemoteInvite, event_to_json
from workers.handlers.rooms.writes import RoomWrites
from workers.http.bodies import json_body
from workers.http.errors import ApiError, checked

FEDERATION = "/_matrix/federation/v2"


class FederationStandIn:
    def __init__(self, writes: RoomWrites, secret: str | None) -> None:
        self._writes = writes
        self._secret = secret.encode() if secret else None

    def routes(self) -> list[web.RouteDef]:
        return [web.put(f"{FEDERATION}/invite/{{room_id}}/{{event_id}}", self.invite)]

    async def invite(self, request: web.Request) -> web.Response:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if (
            self._secret is None
            or scheme != "Bearer"
            or not hmac.compare_digest(given.encode(), self._secret)
        ):
            raise ApiError(
                401, "M_UNAUTHORIZED", "federation requests to this cluster need its worker secret"
            )
        room_id = checked(identifiers.check_room_id, request.match_info["room_id"])
        event_id = request.match_info["event_id"]
        if not event_id.startswith("$") or len(event_id) > identifiers.MAX_ID_LENGTH:
            raise ApiError(400, "M_INVALID_PARAM", "eventId must be an event id ($...)")
        body = await json_body(request)
        try:
            invite = RemoteInvite.from_json(room_id, event_id, body)
            checked(identifiers.check_user_id, invite.invitee)
            checked(identifiers.check_user_id, invite.event.sender)
        except ValueError as e:
            raise ApiError(400, "M_BAD_JSON", str(e)) from None
        await self._writes.remote_invite(invite)
        return web.json_response({"event": event_to_json(invite.event)})
