"""Vercel's own offline Queues emulator, on a clock the tests drive.

`python -m vercel.queue.devserver` serves the emulator on the wall clock. The contract suite
needs leases, delays and retention to pass without waiting, so this runs the same emulator app
(`vercel.queue.embedded.create_embedded_queue_app`, from PyPI `vercel-queue[devserver]`) on its
manual clock and adds one route beside Vercel's API:

    GET  /__emulator/clock                       -> {"now": <unix seconds>}
    POST /__emulator/clock {"advanceSeconds": N}  -> {"now": <unix seconds>}

Everything else goes to the emulator untouched. Prints {"baseUrl": ...} on stdout once it
listens, like the devserver, and exits on SIGTERM/SIGINT or when stdin closes.
"""

import argparse
import asyncio
import json
import sys
import threading

import uvicorn
from vercel.queue.embedded import create_embedded_queue_app

CLOCK_PATH = "/__emulator/clock"


def with_clock_route(app):
    async def asgi(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != CLOCK_PATH:
            return await app(scope, receive, send)
        status = 200
        if scope["method"] == "POST":
            body = b""
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            try:
                seconds = float(json.loads(body or b"{}")["advanceSeconds"])
                if seconds < 0:
                    raise ValueError("advanceSeconds must not be negative")
                app.state.shift(seconds)
            except (KeyError, TypeError, ValueError) as exc:
                status = 400
                payload = {"error": f"expected {{\"advanceSeconds\": N >= 0}}: {exc}"}
        if status == 200:
            payload = {"now": app.state.now.timestamp()}
        data = json.dumps(payload).encode()
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        })
        await send({"type": "http.response.body", "body": data})

    return asgi


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    app = create_embedded_queue_app(manual_clock=True)
    config = uvicorn.Config(
        with_clock_route(app), host=args.host, port=args.port, log_level="warning",
        lifespan="off", ws="none",
    )
    server = uvicorn.Server(config)

    async def serve():
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        print(json.dumps({"baseUrl": f"http://{args.host}:{port}"}), flush=True)
        await task

    # The parent (a test) may die without signalling: stop when our stdin closes.
    def watch_stdin():
        sys.stdin.read()
        server.should_exit = True

    threading.Thread(target=watch_stdin, daemon=True).start()
    asyncio.run(serve())


if __name__ == "__main__":
    main()
