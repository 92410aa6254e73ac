"""An A2A 1.0 agent built with the a2a-sdk, for the A2A bridge tests.

Usage: python a2a_agent.py PORT [SIGNING_KEY KID] (PORT 0: any free port; it prints
`listening PORT`). With SIGNING_KEY (a PEM P-256 private key) and KID, its card is signed with
the SDK's card signer (ES256, that kid).

What it does depends on the first text it receives (its SILP-aware part reads the
`silp-code` part silpgate sends, and answers in SILP code):
- a text starting with "slow": a task that works for two seconds, then completes with an
  artifact;
- a text starting with "progress": a task that works for three steps of half a second,
  reporting each (a status message "step N/3") and appending a chunk to its artifact
  ("part N"), then completes;
- a text starting with "fail": a task that fails with a status message;
- a text starting with "reject": a task that is rejected;
- a text starting with "ask": a task that wants input ("which warehouse?"); the next message
  in that task (its taskId) answers it, and the task completes with the artifact
  "shipping from <that message's text>";
- a text starting with "login": a task that wants authentication ("sign in at the portal");
  the next message in that task completes it the same way;
- anything else: an immediate Message. A part whose metadata says it is SILP code
  `verb(argument)` is answered with SILP code `book(argument)`; plain text is echoed back as
  "echo: <text> (context <the request's contextId>)". A message whose metadata carries a
  session renewal notice (`silp_renewal`) gets one more text part: "renewal seen at turn N".
"""

import asyncio
import re
import sys

import listening
from starlette.applications import Starlette

from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    TaskState,
)


def silp_answer(part: Part) -> Part | None:
    """The SILP code answer to a part that carries SILP code, else None."""
    nlip = dict(part.metadata).get("nlip")
    if nlip is None or not part.HasField("text"):
        return None
    if dict(nlip).get("subformat") != "silp-code":
        return None
    match = re.fullmatch(r"\s*[a-z_]+\((.*)\)\s*", part.text)
    answer = new_text_part(f"book({match.group(1) if match else 'unknown'})")
    answer.metadata.update({"nlip": {"format": "structured", "subformat": "silp-code"}})
    return answer


class Agent(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        texts = [p.text for p in message.parts if p.HasField("text")]
        first = texts[0] if texts else ""
        asked = context.current_task
        if asked is not None and asked.status.state in (
            TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED
        ):
            updater = TaskUpdater(event_queue, asked.id, asked.context_id)
            await updater.start_work()
            await updater.add_artifact([new_text_part(f"shipping from {first}")], name="result")
            await updater.complete()
            return
        if first.startswith(("slow", "fail", "reject", "ask", "login", "progress")):
            task = context.current_task or new_task_from_user_message(message)
            await event_queue.enqueue_event(task)
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            await updater.start_work()
            if first.startswith("progress"):
                for step in (1, 2, 3):
                    await asyncio.sleep(0.5)
                    said = updater.new_agent_message([new_text_part(f"step {step}/3")])
                    await updater.update_status(TaskState.TASK_STATE_WORKING, message=said)
                    await updater.add_artifact(
                        [new_text_part(f"part {step} ")], artifact_id="result", name="result", append=step > 1
                    )
                await updater.complete()
            elif first.startswith("slow"):
                await asyncio.sleep(2)
                await updater.add_artifact([new_text_part(f"finished: {first}")], name="result")
                await updater.complete()
            elif first.startswith("fail"):
                await updater.failed(updater.new_agent_message([new_text_part("the warehouse is on fire")]))
            elif first.startswith("ask"):
                await updater.requires_input(updater.new_agent_message([new_text_part("which warehouse?")]))
            elif first.startswith("login"):
                await updater.requires_auth(updater.new_agent_message([new_text_part("sign in at the portal")]))
            else:
                await updater.reject(updater.new_agent_message([new_text_part("not my job")]))
            return
        parts = []
        for part in message.parts:
            silp = silp_answer(part)
            if silp is not None:
                parts.append(silp)
            elif part.HasField("text"):
                parts.append(new_text_part(f"echo: {part.text} (context {message.context_id})"))
        renewal = dict(message.metadata).get("silp_renewal")
        if renewal is not None:
            # Says it saw the session's renewal notice, carried in the call's metadata.
            parts.append(new_text_part(f"renewal seen at turn {int(dict(renewal)['turn'])}"))
        answer = Message(
            role=Role.ROLE_AGENT,
            message_id="answer-" + message.message_id,
            context_id=message.context_id,
            parts=parts,
        )
        await event_queue.enqueue_event(answer)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


def card(port: int, streaming: bool = False) -> AgentCard:
    return AgentCard(
        name="test-a2a-agent",
        description="Echoes text, answers SILP code, runs slow, failing and rejected tasks",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=streaming, push_notifications=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["test"])],
    )


def app(port: int, streaming: bool = False, signing: tuple[str, str] | None = None) -> Starlette:
    agent_card = card(port, streaming)
    if signing is not None:
        from a2a.utils.signing import create_agent_card_signer

        key_path, kid = signing
        with open(key_path) as key:
            signer = create_agent_card_signer(key.read(), {"kid": kid, "alg": "ES256", "typ": "JOSE"})
        agent_card = signer(agent_card)
    handler = DefaultRequestHandlerV2(agent_executor=Agent(), task_store=InMemoryTaskStore(), agent_card=agent_card)
    routes = create_agent_card_routes(agent_card) + create_jsonrpc_routes(handler, rpc_url="/")
    return Starlette(routes=routes)


if __name__ == "__main__":
    signed_with = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else None
    listening.serve(lambda port: app(port, signing=signed_with), int(sys.argv[1]))
