"""An A2A client built with the Python a2a-sdk, for silpgate's A2A front door.

Usage: python a2a_client.py BASE_URL IR_JSON [INTERFACE]

INTERFACE is the card's interface to speak: `1.0` (the default: the SDK's own choice, JSON-RPC
1.0), `0.3` (its JSON-RPC 0.3 interface, which the SDK speaks through its own 0.3 transport:
`message/send`, `message/stream`, 0.3's shapes) or `HTTP+JSON` (the HTTP+JSON binding of
1.0). For the last two the card's interfaces are narrowed to that one before the SDK picks.

Resolves the agent card at BASE_URL, then sends two messages through the SDK's JSON-RPC
transport: the IR (a data part, no metadata) in context "front-ctx-1" with a streaming client
(SendStreamingMessage, as the SDK chooses when the card offers streaming), and the text
"fail now" in context "front-ctx-2" with a non-streaming one (SendMessage). Prints one JSON
object: {"card": the card, "transports": the names of the SDK's transports that spoke,
"ir_answer": the first response, "fail_answer": the second}, each response as the SDK read
it (protobuf JSON).
"""

import asyncio
import json
import sys

from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf import struct_pb2

from a2a.client import ClientConfig, create_client
from a2a.client.card_resolver import A2ACardResolver
from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import AgentCard, Message, Part, Role, SendMessageRequest

import httpx


async def send(client, parts, context):
    request = SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=f"msg-{context}", context_id=context, parts=parts)
    )
    answers = []
    async for response in client.send_message(request):
        answers.append(MessageToDict(response))
    return answers


async def main(base: str, ir_json: str, interface: str) -> None:
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, base).get_agent_card()
    target = base
    if interface != "1.0":
        target = AgentCard()
        target.CopyFrom(card)
        del target.supported_interfaces[:]
        target.supported_interfaces.extend(
            i for i in card.supported_interfaces
            if i.protocol_binding == interface or i.protocol_version.startswith(interface)
        )
    config = {"supported_protocol_bindings": ["HTTP+JSON"]} if interface == "HTTP+JSON" else {}
    streaming = await create_client(target, ClientConfig(streaming=True, **config))
    plain = await create_client(target, ClientConfig(streaming=False, **config))
    data = struct_pb2.Value()
    ParseDict(json.loads(ir_json), data)
    ir_answer = await send(streaming, [Part(data=data)], "front-ctx-1")
    fail_answer = await send(plain, [new_text_part("fail now")], "front-ctx-2")
    # Which of the SDK's transports spoke: JsonRpcTransport (1.0) or CompatJsonRpcTransport (0.3).
    transports = sorted({type(c._transport).__name__ for c in (streaming, plain)})
    print(json.dumps({"card": MessageToDict(card), "transports": transports, "ir_answer": ir_answer, "fail_answer": fail_answer}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "1.0"))
