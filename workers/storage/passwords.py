"""Password hashes: argon2id (argon2-cffi), computed in a thread so a login never stalls the loop.

A hash takes tens of milliseconds by design; running it on the event loop would hold every other
request of the worker for that long.
"""

from __future__ import annotations

import asyncio

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

#: RFC 9106's second recommended option, with less memory: about 20 ms a hash on this machine.
_HASHER = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)
#: Compared against when the account does not exist, so a missing user costs as long as a wrong password.
_DUMMY = _HASHER.hash("no such account")


async def hash_password(password: str) -> str:
    return await asyncio.to_thread(_HASHER.hash, password)


async def verify_password(password: str, stored: str | None) -> bool:
    """True when `password` matches `stored`; False for no stored hash (after the same work)."""

    def verify() -> bool:
        try:
            return _HASHER.verify(stored or _DUMMY, password) and stored is not None
        except (VerificationError, InvalidHashError):
            return False

    return await asyncio.to_thread(verify)
