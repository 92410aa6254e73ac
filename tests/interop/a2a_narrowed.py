"""An a2a-sdk client of one generation of an agent: the tests' A2A clients share it.

`client(base, interface, streaming)` resolves the card at `base` as the SDK's clients do,
narrows its interfaces to the JSON-RPC one of `interface` (`1.0`, or `0.3`, which the SDK
speaks through its 0.3 transport), and returns the SDK's client for it.
"""

import httpx

from a2a.client import ClientConfig, create_client
from a2a.client.card_resolver import A2ACardResolver
from a2a.types.a2a_pb2 import AgentCard


async def client(base: str, interface: str, streaming: bool):
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, base).get_agent_card()
    narrowed = AgentCard()
    narrowed.CopyFrom(card)
    del narrowed.supported_interfaces[:]
    narrowed.supported_interfaces.extend(
        i for i in card.supported_interfaces
        if i.protocol_binding == "JSONRPC" and i.protocol_version.startswith(interface)
    )
    return await create_client(narrowed, ClientConfig(streaming=streaming))
