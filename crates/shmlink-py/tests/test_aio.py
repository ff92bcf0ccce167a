"""asyncio: shmlink.aio, and a raw Connection driven by loop.add_reader."""

import asyncio

import pytest

import shmlink
import peers
import shmlink.aio


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_aio_echo_with_many_concurrent_clients(addr):
    async def main():
        listener = await shmlink.aio.listen(addr)

        async def serve(conn):
            async with conn:
                async for msg in conn:
                    await conn.send(msg)

        async def accept_all(n):
            tasks = []
            for _ in range(n):
                tasks.append(asyncio.ensure_future(serve(await listener.accept())))
            await asyncio.gather(*tasks)

        async def client(i):
            conn = await shmlink.aio.connect(addr)
            for r in range(100):
                await conn.send(b"%d-%d" % (i, r))
                assert await conn.recv() == b"%d-%d" % (i, r)
            await conn.close()

        n = 16
        await asyncio.gather(accept_all(n), *(client(i) for i in range(n)))
        listener.close()

    run(main())


def test_add_reader_with_a_plain_connection(addr):
    async def main():
        loop = asyncio.get_running_loop()
        with shmlink.listen(addr) as listener:
            client, server = peers.pair(listener, addr)
            server.setblocking(False)
            got = []
            done = loop.create_future()

            def on_readable():
                while True:
                    try:
                        got.append(server.recv())
                    except BlockingIOError:
                        return
                    except EOFError:
                        loop.remove_reader(server.fileno())
                        done.set_result(None)
                        return

            loop.add_reader(server.fileno(), on_readable)
            for i in range(500):
                client.send(b"%d" % i)
                if i % 50 == 0:
                    await asyncio.sleep(0)
            client.close()
            await done
            assert got == [b"%d" % i for i in range(500)]
            server.close()

    run(main())


def test_aio_large_messages_and_flow_control(addr):
    async def main():
        listener = await shmlink.aio.listen(addr, ring_size=64 * 1024)
        client, server = await asyncio.gather(
            shmlink.aio.connect(addr, ring_size=64 * 1024), listener.accept())
        big = bytes(range(256)) * 4096  # 1 MiB: many ring fills

        async def sender():
            for _ in range(8):
                await client.send(big)

        async def receiver():
            for _ in range(8):
                assert await server.recv() == big

        await asyncio.gather(sender(), receiver())
        await client.close()
        with pytest.raises(EOFError):
            await server.recv()
        await server.close()
        listener.close()

    run(main())


def test_aio_pubsub(addr):
    async def main():
        pub = await shmlink.aio.publish(addr)
        sub = await shmlink.aio.subscribe(addr)
        pub.publisher.wait_for_subscribers(1, 10)

        async def produce():
            for i in range(2000):
                await pub.publish(b"%d" % i)
            await pub.close()

        async def consume():
            return [m async for m in sub]

        _, got = await asyncio.gather(produce(), consume())
        assert got == [b"%d" % i for i in range(2000)]
        sub.close()

    run(main())
