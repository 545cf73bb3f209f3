"""Accounts: register, login, logout, whoami, and Synapse's shared-secret admin registration.

* `POST /register` follows the `registration` policy: `closed` (403), `open` (one interactive-auth
  stage, `m.login.dummy`) or `token` (one stage, `m.login.registration_token`, whose token is
  reserved before the account is made and spent once it is; a failed registration gives it back).
  A first call without `auth` gets the 401 with the flows and a session, as the spec says.
  `GET /register/available` checks a name; `GET /v1/register/m.login.registration_token/validity`
  a token. Registration attempts are rate limited per client address (`rc_registration`).
* `GET /login` lists `m.login.password`; `POST /login` checks the password (argon2id) and makes a
  device (on the user's device_lists writer, which records the change) and a token. Rate limited
  per client address, per account tried, and per account's wrong passwords (`rc_login`).
  `POST /logout` ends the token and its device; `/logout/all` every one. `POST /account/password`
  (the password confirmed by user-interactive auth) sets a new one and, unless `logout_devices` is
  false, ends every other device and token of the user.
* `GET|POST /_synapse/admin/v1/register`: a nonce, then an HMAC-SHA1 of
  `nonce\\0user\\0password\\0admin|notadmin` under `registration_shared_secret` (the grammar of
  Synapse's `register_new_matrix_user`), for scripts; works when open registration is off.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.stored.device_lists import DeviceLists
from workers.http.auth import access_token, confirm_password, forget_tokens, requester, token_key
from workers.http.bodies import json_body
from workers.http.errors import ApiError, unavailable
from workers.http.rate_limits import RateLimiter
from workers.storage import registration_tokens, users
from workers.storage.passwords import hash_password, verify_password

CLIENT = "/_matrix/client/v3"
TOKEN_STAGE = "m.login.registration_token"
TOKEN_VALIDITY = f"/_matrix/client/v1/register/{TOKEN_STAGE}/validity"
NONCE_MAX_AGE_MS = 60_000
MAX_PASSWORD = 512


@dataclass(frozen=True)
class AccountSettings:
    server_name: str
    #: closed, open or token (`WorkerConfig.registration`)
    registration: str
    registration_shared_secret: str | None


class Accounts:
    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: AccountSettings,
        devices: DeviceLists | None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._pool = pool
        self.settings = settings
        self._devices = devices
        self._limiter = limiter

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"{CLIENT}/register", self.register),
            web.get(f"{CLIENT}/register/available", self.available),
            web.get(TOKEN_VALIDITY, self.token_validity),
            web.get(f"{CLIENT}/login", self.login_flows),
            web.post(f"{CLIENT}/login", self.login),
            web.post(f"{CLIENT}/logout", self.logout),
            web.post(f"{CLIENT}/logout/all", self.logout_all),
            web.get(f"{CLIENT}/account/whoami", self.whoami),
            web.post(f"{CLIENT}/account/password", self.change_password),
            web.get(f"{CLIENT}/profile/{{user_id}}", self.profile),
            web.get(f"{CLIENT}/profile/{{user_id}}/{{field}}", self.profile),
            web.get("/_synapse/admin/v1/register", self.admin_nonce),
            web.post("/_synapse/admin/v1/register", self.admin_register),
        ]

    def _localpart(self, name: Any) -> str:
        if not isinstance(name, str):
            raise ApiError(400, "M_INVALID_USERNAME", "username must be a string")
        local = identifiers.localpart_of(name, self.settings.server_name)
        if local is None:
            raise ApiError(400, "M_INVALID_USERNAME", f"{name} is not a user of {self.settings.server_name}")
        try:
            return identifiers.check_localpart(local, self.settings.server_name)
        except ValueError as e:
            raise ApiError(400, "M_INVALID_USERNAME", str(e)) from None

    @staticmethod
    def _password(value: Any, required: bool) -> str | None:
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value or len(value) > MAX_PASSWORD:
            raise ApiError(
                400, "M_INVALID_PARAM", f"password must be a string of 1 to {MAX_PASSWORD} characters"
            )
        return value

    async def register(self, request: web.Request) -> web.Response:
        if request.query.get("kind", "user") == "guest":
            raise ApiError(403, "M_GUEST_ACCESS_FORBIDDEN", "guest accounts are not offered")
        policy = self.settings.registration
        if policy == "closed":
            raise ApiError(403, "M_FORBIDDEN", "registration is closed on this server")
        stage = TOKEN_STAGE if policy == "token" else "m.login.dummy"
        body = await json_body(request)
        username = body.get("username")
        local = self._localpart(username) if username is not None else f"u{secrets.token_hex(6)}"
        password = self._password(body.get("password"), required=False)
        auth = body.get("auth")
        if not isinstance(auth, dict) or auth.get("type") != stage:
            # The spec's user-interactive auth: say which stages complete it. Clients retry with
            # {"auth": {"type": <stage>, "session": ...}}.
            if username is not None:
                await self._check_available(local)
            return _auth_needed(stage)
        await self._limit(request, "registration", "address")
        device_id, display_name = _device_fields(body)
        user_id = identifiers.user_id(local, self.settings.server_name)
        inhibit_login = body.get("inhibit_login") is True
        if policy == "open":
            return web.json_response(
                await self._create(user_id, password, False, inhibit_login, device_id, display_name)
            )
        token = auth.get("token")
        async with self._pool.acquire() as conn:
            reserved = isinstance(token, str) and await registration_tokens.reserve(conn, token)
        if not reserved:
            return _auth_needed(stage, "M_UNAUTHORIZED", "invalid registration token")
        assert isinstance(token, str)
        try:
            created = await self._create(user_id, password, False, inhibit_login, device_id, display_name)
        except BaseException:
            async with self._pool.acquire() as conn:
                await registration_tokens.release(conn, token)
            raise
        async with self._pool.acquire() as conn:
            await registration_tokens.complete(conn, token)
        return web.json_response(created)

    async def token_validity(self, request: web.Request) -> web.Response:
        """Whether a registration token can be used now (it is not reserved by asking)."""
        if self.settings.registration != "token":
            raise ApiError(403, "M_FORBIDDEN", "registration does not take tokens on this server")
        token = request.query.get("token")
        if token is None:
            raise ApiError(400, "M_MISSING_PARAM", "the token query parameter is required")
        await self._limit(request, "registration", "validity")
        async with self._pool.acquire() as conn:
            return web.json_response({"valid": await registration_tokens.is_valid(conn, token)})

    def _limiter_for(self, request: web.Request) -> RateLimiter | None:
        """The limiter, unless there is none or the client's address is exempt."""
        limiter = self._limiter
        if limiter is None or limiter.exempt_address(limiter.client_address(request)):
            return None
        return limiter

    async def _limit(self, request: web.Request, action: str, scope: str) -> None:
        """One check of `action`'s limit on the client's address."""
        limiter = self._limiter_for(request)
        if limiter is not None:
            await limiter.check(action, scope, limiter.client_address(request))

    async def _check_available(self, local: str) -> None:
        async with self._pool.acquire() as conn:
            if await users.user_exists(conn, identifiers.user_id(local, self.settings.server_name)):
                raise ApiError(400, "M_USER_IN_USE", "that user name is taken")

    async def _create(
        self,
        user_id: str,
        password: str | None,
        admin: bool,
        inhibit_login: bool,
        device_id: str | None,
        display_name: str | None,
    ) -> dict[str, Any]:
        hashed = None if password is None else await hash_password(password)
        async with self._pool.acquire() as conn:
            try:
                await users.create_user(conn, user_id, hashed, admin)
            except users.UserExistsError:
                raise ApiError(400, "M_USER_IN_USE", f"{user_id} is already registered") from None
            if inhibit_login:
                return {"user_id": user_id, "home_server": self.settings.server_name}
        try:
            session = await self._new_session(user_id, device_id, display_name)
        except BaseException:
            # No token was handed out: take the account back, so that the client's retry of the
            # same registration can succeed.
            async with self._pool.acquire() as conn:
                await users.delete_user(conn, user_id)
            raise
        return _session_body(session, self.settings.server_name)

    async def _new_session(
        self, user_id: str, device_id: str | None, display_name: str | None
    ) -> users.Session:
        """A device (created on the user's device_lists writer, which records the change) and a new
        access token on it."""
        device = device_id or users.new_device_id()
        if self._devices is None:
            raise unavailable("devices are not served by this worker", 10)
        await self._devices.ensure_device(user_id, device, display_name)
        async with self._pool.acquire() as conn:
            return await users.new_session(conn, user_id, device, display_name)

    async def available(self, request: web.Request) -> web.Response:
        local = self._localpart(request.query.get("username"))
        await self._check_available(local)
        return web.json_response({"available": True})

    async def login_flows(self, request: web.Request) -> web.Response:
        return web.json_response({"flows": [{"type": "m.login.password"}]})

    async def login(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if body.get("type") != "m.login.password":
            raise ApiError(400, "M_UNKNOWN", "this server offers m.login.password only")
        identifier = body.get("identifier")
        if isinstance(identifier, dict):
            if identifier.get("type") != "m.id.user":
                raise ApiError(400, "M_UNKNOWN", "identifier.type must be m.id.user")
            name = identifier.get("user")
        else:
            name = body.get("user")  # the deprecated form, still sent by older clients
        if not isinstance(name, str):
            raise ApiError(400, "M_BAD_JSON", "identifier.user is missing")
        password = self._password(body.get("password"), required=True)
        assert password is not None
        device_id, display_name = _device_fields(body)
        local = identifiers.localpart_of(name.lower(), self.settings.server_name)
        user_id = identifiers.user_id(local or "", self.settings.server_name)
        limiter = self._limiter_for(request)
        if limiter is not None:
            await limiter.check("login_address", "address", limiter.client_address(request))
            await limiter.check("login_account", "account", user_id)
            await limiter.check_peek("login_failed", "account", user_id)
        async with self._pool.acquire() as conn:
            stored = await users.password_hash(conn, user_id) if local else None
        if not await verify_password(password, stored):
            if limiter is not None:
                await limiter.record("login_failed", "account", user_id)
            raise ApiError(403, "M_FORBIDDEN", "invalid user name or password")
        session = await self._new_session(user_id, device_id, display_name)
        return web.json_response(_session_body(session, self.settings.server_name))

    async def logout(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        if who.device_id is not None and self._devices is not None:
            # The device goes with its tokens, recorded on the device_lists and caches streams.
            forget_tokens(request, await self._devices.delete(who.user_id, [who.device_id]))
        else:  # a token without a device is never cached (workers.http.auth)
            async with self._pool.acquire() as conn:
                await users.log_out(conn, access_token(request))
        forget_tokens(request, [token_key(access_token(request))])
        return web.json_response({})

    async def logout_all(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        if self._devices is not None:  # every device and every token of the user
            forget_tokens(request, await self._devices.delete(who.user_id, None))
        else:
            async with self._pool.acquire() as conn:
                forget_tokens(request, users.ended_token_keys(await users.log_out_all(conn, who.user_id)))
        return web.json_response({})

    async def change_password(self, request: web.Request) -> web.Response:
        """As Synapse does: with `logout_devices` (default true) every other device and every other
        token of the user end, recorded like a device deletion; the session that asked stays."""
        who = await requester(self._pool, request)
        body = await json_body(request)
        password = self._password(body.get("new_password"), required=True)
        assert password is not None
        logout = body.get("logout_devices", True)
        if not isinstance(logout, bool):
            raise ApiError(400, "M_BAD_JSON", "logout_devices must be true or false")
        await confirm_password(self._pool, who.user_id, body.get("auth"))
        if logout and self._devices is None:
            raise unavailable("devices are not served by this worker", 10)
        hashed = await hash_password(password)
        async with self._pool.acquire() as conn:
            await users.set_password_hash(conn, who.user_id, hashed)
        if logout and self._devices is not None:
            ended = await self._devices.delete(
                who.user_id, None, except_device=who.device_id, except_token=token_key(access_token(request))
            )
            forget_tokens(request, ended)
        return web.json_response({})

    async def whoami(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        body: dict[str, Any] = {"user_id": who.user_id, "is_guest": False}
        if who.device_id is not None:
            body["device_id"] = who.device_id
        return web.json_response(body)

    async def profile(self, request: web.Request) -> web.Response:
        """A user's profile: the cluster stores no display names or avatars yet, so an existing
        user's profile is empty (the spec's fields are optional) and a field is not found."""
        user_id = request.match_info["user_id"]
        async with self._pool.acquire() as conn:
            exists = await users.user_exists(conn, user_id)
        if not exists or "field" in request.match_info:
            raise ApiError(404, "M_NOT_FOUND", f"no profile {'field ' if exists else ''}for {user_id}")
        return web.json_response({})

    def _admin_secret(self) -> bytes:
        secret = self.settings.registration_shared_secret
        if secret is None:
            raise ApiError(400, "M_UNKNOWN", "shared-secret registration is off (registration_shared_secret)")
        return secret.encode()

    async def admin_nonce(self, request: web.Request) -> web.Response:
        self._admin_secret()
        async with self._pool.acquire() as conn:
            return web.json_response({"nonce": await users.new_nonce(conn)})

    async def admin_register(self, request: web.Request) -> web.Response:
        secret = self._admin_secret()
        body = await json_body(request)
        nonce, username, mac = body.get("nonce"), body.get("username"), body.get("mac")
        password = self._password(body.get("password"), required=True)
        assert password is not None
        admin = body.get("admin") is True
        if not isinstance(nonce, str) or not isinstance(mac, str) or not nonce.isprintable():
            raise ApiError(400, "M_BAD_JSON", "nonce and mac are required strings")
        local = self._localpart(username)
        expected = hmac.new(secret, digestmod=hashlib.sha1)
        for part in (nonce, str(username), password):
            expected.update(part.encode() + b"\x00")
        expected.update(b"admin" if admin else b"notadmin")
        async with self._pool.acquire() as conn:
            if not await users.take_nonce(conn, nonce, NONCE_MAX_AGE_MS):
                raise ApiError(400, "M_UNKNOWN", "unrecognised or expired nonce")
        if not hmac.compare_digest(expected.hexdigest(), mac.lower()):
            raise ApiError(403, "M_FORBIDDEN", "HMAC incorrect")
        device_id, display_name = _device_fields(body)
        user_id = identifiers.user_id(local, self.settings.server_name)
        return web.json_response(await self._create(user_id, password, admin, False, device_id, display_name))


def _auth_needed(stage: str, errcode: str | None = None, error: str | None = None) -> web.Response:
    """The user-interactive-auth 401: the one flow, a session, and why the last try failed."""
    body: dict[str, Any] = {
        "flows": [{"stages": [stage]}],
        "params": {},
        "session": secrets.token_urlsafe(16),
    }
    if errcode is not None:
        body.update(errcode=errcode, error=error)
    return web.json_response(body, status=401)


def _device_fields(body: dict[str, Any]) -> tuple[str | None, str | None]:
    device_id, name = body.get("device_id"), body.get("initial_device_display_name")
    # Printable only: PostgreSQL refuses a NUL in text, and a refused row must not be found there.
    if device_id is not None and (
        not isinstance(device_id, str) or not 1 <= len(device_id) <= 255 or not device_id.isprintable()
    ):
        raise ApiError(400, "M_INVALID_PARAM", "device_id must be 1 to 255 printable characters")
    if name is not None and (not isinstance(name, str) or len(name) > 255 or "\x00" in name):
        raise ApiError(400, "M_INVALID_PARAM", "initial_device_display_name: at most 255 characters, no NUL")
    return device_id, name


def _session_body(session: users.Session, server_name: str) -> dict[str, Any]:
    return {
        "user_id": session.user_id,
        "access_token": session.access_token,
        "device_id": session.device_id,
        "home_server": server_name,
    }
