"""An A2A client built with the Python a2a-sdk whose streams drop, for silpgate's A2A door.

Usage: python a2a_resume_client.py BASE_URL [INTERFACE]

Resolves the card at BASE_URL and narrows it to its JSON-RPC interface of INTERFACE (`1.0`, the
default, or `0.3`). Then, as a client whose connection drops would:
- sends "progress report" with SendStreamingMessage (context "resume-INTERFACE"), reads the
  first event (the task) and drops the stream; asks GetTask and, in 1.0, ListTasks; follows
  the task again with SubscribeToTask to its end; asks GetTask once more;
- sends "progress report" the same way (context "cancel-INTERFACE"), drops the stream after
  the first event and cancels the task with CancelTask.

Prints one JSON object: "task" (the first task's id), "working" (its GetTask after the drop),
"listed" (the ids ListTasks answered, 1.0 only), "followed" (each SubscribeToTask event as the
SDK read it, protobuf JSON, with "ms" from the call to its arrival), "ended" (GetTask after the
stream), "canceled" (the second task's CancelTask answer).
"""

import asyncio
import json
import sys
import time

from google.protobuf.json_format import MessageToDict

from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
)

import a2a_narrowed


async def stream_then_drop(client, context: str) -> str:
    """Sends "progress report" streaming; returns the task id of the first event, having
    closed the stream."""
    request = SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=context, context_id=context,
                        parts=[new_text_part("progress report")])
    )
    events = client.send_message(request)
    try:
        async for response in events:
            return response.task.id
    finally:
        await events.aclose()
    raise RuntimeError("the stream ended without an event")


async def main(base: str, interface: str) -> None:
    client = await a2a_narrowed.client(base, interface, streaming=True)
    out = {}
    task = await stream_then_drop(client, f"resume-{interface}")
    out["task"] = task
    out["working"] = MessageToDict(await client.get_task(GetTaskRequest(id=task)))
    if interface == "1.0":
        listed = await client.list_tasks(ListTasksRequest())
        out["listed"] = [t.id for t in listed.tasks]
    started = time.perf_counter()
    followed = []
    async for response in client.subscribe(SubscribeToTaskRequest(id=task)):
        event = MessageToDict(response)
        event["ms"] = round((time.perf_counter() - started) * 1000)
        followed.append(event)
    out["followed"] = followed
    out["ended"] = MessageToDict(await client.get_task(GetTaskRequest(id=task)))
    second = await stream_then_drop(client, f"cancel-{interface}")
    out["canceled"] = MessageToDict(await client.cancel_task(CancelTaskRequest(id=second)))
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "1.0"))
