"""Checks the signature of an A2A agent card with the Python a2a-sdk's own verifier.

Usage: python a2a_card_check.py BASE_URL JWKS_PATH

Resolves the card at BASE_URL as the SDK's clients do, and verifies its signatures with the
SDK's signature verifier (ES256), the keys taken from the JWK set at JWKS_PATH by their kid.
Prints one JSON object: "signatures" (how many the card carries), "verified", and "error"
when it is not.
"""

import asyncio
import json
import sys

import httpx
from jwt import PyJWKSet
from jwt.exceptions import InvalidKeyError

from a2a.client.card_resolver import A2ACardResolver
from a2a.utils.signing import SignatureVerificationError, create_signature_verifier


async def main(base: str, jwks: str) -> None:
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, base).get_agent_card()
    with open(jwks) as keys_file:
        keys = PyJWKSet.from_json(keys_file.read())

    def key_of(kid, _jku):
        # Only the keys given: a jku in the header is never followed.
        for key in keys.keys:
            if key.key_id == kid:
                return key
        raise InvalidKeyError(f"no key {kid}")

    verify = create_signature_verifier(key_of, ["ES256"])
    out = {"signatures": len(card.signatures)}
    try:
        verify(card)
        out["verified"] = True
    except SignatureVerificationError as e:
        out["verified"] = False
        out["error"] = repr(e)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
