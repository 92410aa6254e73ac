"""A streaming A2A client built with the Python a2a-sdk, for silpgate's A2A door.

Usage: python a2a_stream_client.py BASE_URL TEXT [INTERFACE]

Resolves the card at BASE_URL, narrows its interfaces to INTERFACE (`1.0`, the default, or
`0.3`, which the SDK speaks through its 0.3 transport), sends TEXT with SendStreamingMessage
in context "stream-ctx", and prints one JSON list: each event as the SDK read it (protobuf
JSON), with "ms", the milliseconds from the send to its arrival.
"""

import asyncio
import json
import sys
import time

from google.protobuf.json_format import MessageToDict

from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import Message, Role, SendMessageRequest

import a2a_narrowed


async def main(base: str, text: str, interface: str) -> None:
    client = await a2a_narrowed.client(base, interface, streaming=True)
    request = SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id="stream-1", context_id="stream-ctx", parts=[new_text_part(text)])
    )
    started = time.perf_counter()
    events = []
    async for response in client.send_message(request):
        event = MessageToDict(response)
        event["ms"] = round((time.perf_counter() - started) * 1000)
        events.append(event)
    print(json.dumps(events))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "1.0"))
