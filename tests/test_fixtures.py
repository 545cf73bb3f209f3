import asyncpg
import redis.asyncio as aioredis


async def test_db_and_redis(db_pool: asyncpg.Pool, redis_url: str) -> None:
    assert await db_pool.fetchval("SELECT count(*) FROM stream_positions") == 0
    r = aioredis.from_url(redis_url)
    assert await r.ping()
    await r.aclose()
