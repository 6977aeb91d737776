#!/usr/bin/env python3
"""Webhook signatures as the official `stripe` package verifies them: the authority the
project's verifier (`payment_core::stripe_webhook`) and the simulator's signer are held to.

Reads a JSON list of cases on stdin; each is {"name", "body", "held": [secrets], "tolerance",
and either "header" (given as is, or null for none) or "sign": {"secrets": [...], "t": unix
seconds} (signed here by the simulator's own signer, `infra/provider-sim/events.py`)}. Writes a
JSON list of {"name", "header", "stripe_accepts", "why"}: whether
stripe.WebhookSignature.verify_header accepts the body and header under any held secret.

Run with the virtualenv that holds the pinned stripe package (infra/contract/requirements.txt).
"""

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
    return False, "; ".join(why)


def main():
    out = []
    for case in json.load(sys.stdin):
        body = case["body"]
        if "sign" in case:
            header = events.sign(body.encode(), case["sign"]["secrets"], case["sign"]["t"])
        else:
            header = case["header"]
        accepts, why = verdict(body, header, case["held"], case["tolerance"])
        out.append({"name": case["name"], "header": header, "stripe_accepts": accepts, "why": why})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
