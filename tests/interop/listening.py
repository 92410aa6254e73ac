"""Serves an ASGI app on 127.0.0.1, on the port asked for or, with 0, on one the system picks.

Prints `listening PORT` once the socket is bound, so that a test reads the port it got
instead of guessing a free one that another process may take first. Run as a script, it
serves `module:app`: `python listening.py nlip_server.echo:app 0`.
"""

import importlib
import socket
import sys

import uvicorn


def serve(make_app, port):
    """Binds `port` (0: any), then serves `make_app(bound_port)`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    app = make_app(bound)
    print(f"listening {bound}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    module, name = sys.argv[1].split(":")
    serve(lambda _port: getattr(importlib.import_module(module), name), int(sys.argv[2]))
