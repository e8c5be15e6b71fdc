#!/usr/bin/env python3
"""The bare-ASGI floor of a heartbeat, for bench/fleet_pulse.py (issue 39, item 2).

    .venv/bin/python bench/floor_app.py --port 8123

A minimal ASGI app under uvicorn, started as ``scheduler serve`` starts a replica
(``scheduler/cli.py``: ``uvicorn.run`` in one process, the same loop and HTTP parser,
uvloop and httptools when installed, no access log, the same log level), that answers
any request the way a replica answers a heartbeat: it reads the body to its end and
answers 200 with a JSON body of the heartbeat's shape and size (``HeartbeatOut``: the
host named by the path, its state, generation and the time), Content-Length and
Content-Type as the fast path sends them. Nothing else: no token, no routing, no
liveness. The server CPU it takes per request is the least any server on this stack
can take for that request; the bench measures it beside the replicas' own.
"""

from __future__ import annotations

import argparse
import time

import uvicorn

PREFIX, SUFFIX = "/v1/hosts/", "/heartbeat"


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
        more = msg.get("more_body", False)
    path = scope["path"]
    name = path[len(PREFIX):-len(SUFFIX)] if path.startswith(PREFIX) and path.endswith(SUFFIX) else "-"
    data = b'{"name":"%s","state":"active","generation":1,"last_heartbeat":%r}' % (name.encode(), time.time())
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    a = p.parse_args()
    # the replica's call (scheduler/cli.py _serve) with its bench settings: log_level
    # "WARNING", plain HTTP; loop and http left to uvicorn's "auto", as there
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
