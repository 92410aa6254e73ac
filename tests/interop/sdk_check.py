"""Feeds envelopes silpgate emitted to the Python NLIP SDK (nlip_sdk) and checks that each one
parses and keeps its content.

Input: a JSON-lines file, one envelope per line. Output: one line per failure; exit status 1
when any envelope fails, 0 when all pass.
"""
import json
import sys

from nlip_sdk.nlip import NLIP_Message

KNOWN = ("messagetype", "format", "subformat", "content", "label")


def known_fields(envelope):
    """The fields the SDK models, as silpgate wrote them (format values lower-cased)."""
    out = {k: envelope[k] for k in KNOWN if k in envelope}
    if "submessages" in envelope:
        out["submessages"] = [{k: s[k] for k in KNOWN[1:] if k in s} for s in envelope["submessages"]]
    return out


def main(path):
    failures = 0
    count = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            count += 1
            try:
                message = NLIP_Message.model_validate_json(line)
            except Exception as e:  # the SDK's pydantic ValidationError, or anything else
                print(f"line {number}: rejected by nlip_sdk: {e}".replace("\n", " | "))
                failures += 1
                continue
            parsed = json.loads(message.to_json())
            expected = known_fields(json.loads(line))
            if parsed != expected:
                print(f"line {number}: content changed\n  sent:   {json.dumps(expected)}\n  parsed: {json.dumps(parsed)}")
                failures += 1
    print(f"{count} envelopes checked, {failures} failed")
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
