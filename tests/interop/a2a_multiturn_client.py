"""An A2A client built with the Python a2a-sdk that answers an agent's question, through
silpgate's A2A door.

Usage: python a2a_multiturn_client.py BASE_URL [INTERFACE]

Resolves the card at BASE_URL and narrows it to its JSON-RPC interface of INTERFACE (`1.0`, the
default, or `0.3`). Sends "ask for a warehouse" with SendMessage (context
"turns-INTERFACE"); the task it is answered with asks a question. Then sends "north" in that
task (its taskId and contextId), and asks GetTask for the task after.

Prints one JSON object: "asked" (the first answer's task, protobuf JSON), "answered" (the
second answer's task) and "got" (GetTask's task).
"""

import asyncio
import json
import sys

from google.protobuf.json_format import MessageToDict

from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import GetTaskRequest, Message, Role, SendMessageRequest

import a2a_narrowed


async def send(client, text: str, context: str, task: str = "") -> dict:
    message = Message(role=Role.ROLE_USER, message_id=f"{context}-{text}", context_id=context,
                      parts=[new_text_part(text)])
    if task:
        message.task_id = task
    async for response in client.send_message(SendMessageRequest(message=message)):
        return MessageToDict(response.task)
    raise RuntimeError("no answer")


async def main(base: str, interface: str) -> None:
    client = await a2a_narrowed.client(base, interface, streaming=False)
    context = f"turns-{interface}"
    asked = await send(client, "ask for a warehouse", context)
    answered = await send(client, "north", context, asked["id"])
    got = MessageToDict(await client.get_task(GetTaskRequest(id=asked["id"])))
    print(json.dumps({"asked": asked, "answered": answered, "got": got}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "1.0"))
