"""An A2A client built with the Python a2a-sdk that asks silpgate's A2A door for push notifications.

Usage: python a2a_push_client.py BASE_URL WEBHOOK_URL

Resolves the card at BASE_URL and, over its JSON-RPC 1.0 interface:
- sends "progress report" (context "push-a") with returnImmediately and a push notification
  config in the send's configuration (token "tok-a", Bearer credentials "hook-secret");
- sends "progress report" (context "push-b") with returnImmediately, then gives its task two
  configs with CreateTaskPushNotificationConfig (ids "b-1", token "tok-b"; and "b-2"), deletes
  "b-2", and reads the configs back with Get and List.

Prints one JSON object: the card's pushNotifications, the two task ids, the config Create
answered, the one Get answered, and the ids List answered after the delete.
"""

import asyncio
import json
import sys

import httpx
from google.protobuf.json_format import MessageToDict

from a2a.client import ClientConfig, create_client
from a2a.client.card_resolver import A2ACardResolver
from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskPushNotificationConfig,
)


async def send(client, context: str, push: TaskPushNotificationConfig | None) -> str:
    configuration = SendMessageConfiguration(return_immediately=True)
    if push is not None:
        configuration.task_push_notification_config.CopyFrom(push)
    request = SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=context, context_id=context,
                        parts=[new_text_part("progress report")]),
        configuration=configuration,
    )
    async for response in client.send_message(request):
        return response.task.id
    raise RuntimeError("no answer")


async def main(base: str, webhook: str) -> None:
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, base).get_agent_card()
    client = await create_client(card, ClientConfig(streaming=False))
    a = await send(client, "push-a", TaskPushNotificationConfig(
        url=f"{webhook}?task=a", token="tok-a",
        authentication=AuthenticationInfo(scheme="Bearer", credentials="hook-secret")))
    b = await send(client, "push-b", None)
    created = await client.create_task_push_notification_config(
        TaskPushNotificationConfig(task_id=b, id="b-1", url=f"{webhook}?task=b", token="tok-b"))
    await client.create_task_push_notification_config(
        TaskPushNotificationConfig(task_id=b, id="b-2", url=f"{webhook}?task=b2"))
    await client.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(task_id=b, id="b-2"))
    got = await client.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(task_id=b, id="b-1"))
    listed = await client.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=b))
    print(json.dumps({
        "pushNotifications": card.capabilities.push_notifications,
        "a": a,
        "b": b,
        "created": MessageToDict(created),
        "got": MessageToDict(got),
        "listed": [c.id for c in listed.configs],
    }))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
