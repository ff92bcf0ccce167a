"""asyncio: an echo server and ten concurrent clients in one event loop.
Usage: python asyncio_echo.py shm:aio-echo"""
import asyncio
import sys

import shmlink.aio


async def handle(conn):
    async with conn:
        async for msg in conn:
            await conn.send(msg)


async def client(addr, i):
    conn = await shmlink.aio.connect(addr)
    for r in range(100):
        await conn.send(b"client %d round %d" % (i, r))
        assert await conn.recv() == b"client %d round %d" % (i, r)
    await conn.close()


async def main(addr, n=10):
    listener = await shmlink.aio.listen(addr)

    async def serve():
        handlers = [asyncio.ensure_future(handle(await listener.accept())) for _ in range(n)]
        await asyncio.gather(*handlers)

    await asyncio.gather(serve(), *(client(addr, i) for i in range(n)))
    listener.close()
    print("served", n, "clients")


asyncio.run(main(sys.argv[1]))
