"""Talks to a running silpgate like a Python NLIP client would: messages built with the NLIP SDK
(nlip_sdk), posted over HTTP with the standard library and sent over the WebSocket text
endpoint with the `websockets` package; every reply is parsed with the SDK.

Usage: front_door_check.py HOST:PORT. Prints one line per failure; exit 0 when all pass.
"""
import asyncio
import json
import sys
import urllib.error
import urllib.request

import websockets
from nlip_sdk.nlip import NLIP_Factory, NLIP_Message

failures = []
# Every wait for silpgate is bounded: a hang fails the check instead of the whole test run.
WAIT_SECONDS = 30


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL:", what)


def post(addr, message):
    request = urllib.request.Request(
        f"http://{addr}/nlip",
        data=message.to_json().encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=WAIT_SECONDS) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def decode_request(code, token):
    message = NLIP_Factory.create_structured(code, "silp-code", label="decode")
    message.add_conversation_token(token)
    return message


def http_checks(addr):
    status, body = post(addr, decode_request("if disk>90%: switch(backup_mode)", "py-1"))
    reply = NLIP_Message.model_validate_json(body)
    check(status == 200, f"decode over HTTP: status {status}")
    check(reply.subformat == "silp-ir", f"decode over HTTP: subformat {reply.subformat}")
    check(reply.content["constraints"][0]["value"] == "90%", "decode over HTTP: the IR")
    check(reply.extract_conversation_token() == "py-1", "decode over HTTP: the conversation token is echoed")

    ping = NLIP_Factory.create_control("//ping")
    ping.add_json({"silp": "v1", "frontends": ["json", "code"]})
    status, body = post(addr, ping)
    reply = NLIP_Message.model_validate_json(body)
    check(status == 200 and reply.is_control_msg(), f"//ping over HTTP: status {status}, control {reply.is_control_msg()}")
    check(reply.content.get("preferred") == "json", f"//ping over HTTP: {reply.content}")

    status, body = post(addr, NLIP_Factory.create_text("nobody routes this"))
    reply = NLIP_Message.model_validate_json(body)
    check(status == 404 and reply.messagetype == "error", f"unroutable over HTTP: status {status}")


async def ws_checks(addr):
    async with websockets.connect(f"ws://{addr}/nlip/ws/text") as ws:
        for i in range(20):
            await ws.send(decode_request(f"cancel(item{i})", "py-ws").to_json())
        renewals = 0
        for i in range(20):
            reply = NLIP_Message.model_validate_json(await asyncio.wait_for(ws.recv(), WAIT_SECONDS))
            check(reply.extract_conversation_token() == "py-ws", f"WebSocket reply {i}: token echoed")
            check(not reply.is_control_msg(), f"WebSocket reply {i} is a reply, not a notice")
            # The session renewal notice (every 10 turns by default) rides inside a reply.
            for sub in reply.submessages or []:
                if sub.label == "silp-renewal":
                    renewals += 1
                    check(sub.content.get("renewed") is True, f"WebSocket renewal notice: {sub.content}")
            check(reply.content["entities"][0]["value"] == f"item{i}", f"WebSocket reply {i} out of order")
        check(renewals == 1, f"{renewals} renewal notices for 20 turns with heartbeat 10")


def main(addr):
    http_checks(addr)
    asyncio.run(ws_checks(addr))
    print(f"{'ok' if not failures else 'failed'}: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
