#!/usr/bin/env python3
"""Webhook signatures as the official `stripe` package verifies them: the authority the
project's verifier (`payment_core::stripe::webhook`) and the simulator's signer are held to.

Reads a JSON list of cases on stdin; each is {"name", "body" (text) or "body_hex" (bytes),
"held": [secrets], "tolerance", and either "header" (given as is, or null for none; each
"{SIG}" in it replaced by the v1 signature under "sig": {"secret", "t": the timestamp as Python's
int() reads it}) or "sign": {"secrets": [...], "t": unix seconds} (signed here by the simulator's
own signer, `infra/provider-sim/events.py`)}. Writes a JSON list of {"name", "header",
"stripe_accepts", "why"}: whether stripe.WebhookSignature.verify_header accepts the body and
header under a held secret, tried in order as an application would (an exception other than
SignatureVerificationError, such as the TypeError hmac.compare_digest raises on non-ASCII text,
refuses the delivery).

Run with the virtualenv that holds the pinned stripe package (infra/contract/requirements.txt).
"""

import hashlib
import hmac
import json
import os
import sys

import stripe

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "provider-sim"))
import events  # noqa: E402  (the simulator's signer)


def verdict(body, header, held, tolerance):
    why = []
    for secret in held:
        try:
            stripe.WebhookSignature.verify_header(body, header, secret, tolerance)
            return True, ""
        except stripe.SignatureVerificationError as e:
            why.append(str(e).split(".")[0])
        except Exception as e:  # noqa: BLE001  (what the package raises is its verdict)
            return False, f"{type(e).__name__}: {e}"
    return False, "; ".join(why)


def signature(body, secret, t_text):
    signed = f"{int(t_text)}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def main():
    out = []
    for case in json.load(sys.stdin):
        body = bytes.fromhex(case["body_hex"]) if "body_hex" in case else case["body"].encode()
        if "sign" in case:
            header = events.sign(body, case["sign"]["secrets"], case["sign"]["t"])
        else:
            header = case["header"]
            if header is not None and "sig" in case:
                header = header.replace("{SIG}", signature(body, case["sig"]["secret"], case["sig"]["t"]))
        payload = body if "body_hex" in case else case["body"]
        accepts, why = verdict(payload, header, case["held"], case["tolerance"])
        out.append({"name": case["name"], "header": header, "stripe_accepts": accepts, "why": why})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
