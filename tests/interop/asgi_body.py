"""Reading an ASGI request's body in front of an app, and handing the app the same body, for
the test servers that look at a request before their SDK does."""


async def read_body(receive) -> bytes:
    """The whole body of the request `receive` delivers."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def replaying(body: bytes, receive):
    """A `receive` that delivers `body` once, then what `receive` delivers (a disconnect)."""
    replayed = False

    async def replay():
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
