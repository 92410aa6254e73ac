"""An A2A 1.0 client built with the Python a2a-sdk, for silpgate's A2A front door.

Usage: python a2a_client.py BASE_URL IR_JSON

Resolves the agent card at BASE_URL, then sends two messages through the SDK's JSON-RPC
transport: the IR (a data part, no metadata) in context "front-ctx-1" with a streaming client
(SendStreamingMessage, as the SDK chooses when the card offers streaming), and the text
"fail now" in context "front-ctx-2" with a non-streaming one (SendMessage). Prints one JSON object: {"card": the card,
"ir_answer": the first response, "fail_answer": the second}, each response as the SDK read it
(protobuf JSON).
"""

import asyncio
import json
import sys

from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf import struct_pb2

from a2a.client import ClientConfig, create_client
from a2a.client.card_resolver import A2ACardResolver
from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest

import httpx


async def send(client, parts, context):
    request = SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=f"msg-{context}", context_id=context, parts=parts)
    )
    answers = []
    async for response in client.send_message(request):
        answers.append(MessageToDict(response))
    return answers


async def main(base: str, ir_json: str) -> None:
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, base).get_agent_card()
    streaming = await create_client(base, ClientConfig(streaming=True))
    plain = await create_client(base, ClientConfig(streaming=False))
    data = struct_pb2.Value()
    ParseDict(json.loads(ir_json), data)
    ir_answer = await send(streaming, [Part(data=data)], "front-ctx-1")
    fail_answer = await send(plain, [new_text_part("fail now")], "front-ctx-2")
    print(json.dumps({"card": MessageToDict(card), "ir_answer": ir_answer, "fail_answer": fail_answer}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
