#!/usr/bin/env python3
"""A Stripe-compatible payment provider simulator with fault injection.

It speaks the subset of Stripe's API that the processor uses, with Stripe's idempotency
semantics, and keeps a ledger of every charge per idempotency key so that tests and the demo
can check "charged exactly once" against the provider's own books, never the processor's.

API (Stripe's wire format):
  POST /v1/payment_intents            form body, Authorization: Bearer <key>, Idempotency-Key
      - same key, same parameters: the stored answer again, with Idempotent-Replayed: true
      - same key, other parameters: 400 idempotency_error
      - same key while the first request runs: 409
      - payment_method decides the result (Stripe's test methods):
        pm_card_visa (and any other pm_*) -> 200 succeeded
        pm_card_chargeDeclined -> 402 card_declined / generic_decline
        pm_card_chargeDeclinedInsufficientFunds -> 402 insufficient_funds
        pm_card_threeDSecureRequired -> 200 requires_action
        pm_card_invalid -> 400 invalid_request_error / resource_missing

  POST /v1/refunds                    form body (payment_intent, amount?, reason?, metadata[...]),
                                      Idempotency-Key, the same idempotency semantics
      - payment_intent unknown -> 400 resource_missing; not succeeded -> 400 charge_not_refundable
      - amount (default: what is left) above what is left -> 400 amount_too_large;
        nothing left -> 400 charge_already_refunded; else 200 refund (status succeeded)
  GET  /v1/refunds?payment_intent=PI  every refund of the intent (Stripe's list shape)

Control API (not Stripe's):
  GET /v1/payment_intents/search?query=metadata['payment_id']:'P'
      every intent booked for payment P (charges and declined intents), Stripe's search shape

  GET    /_sim/health
  GET    /_sim/ledger[?key=P]    {"charges": {P: [intent...]}, "declines": {...}, "calls": {P: n},
                                  "refunds": {R: [refund...]}, "refund_calls": {R: n}}
         booked per payment: P is metadata[payment_id] (the Idempotency-Key when absent); refunds
         per refund: R is metadata[refund_id] (the Idempotency-Key when absent)
  POST   /_sim/faults            {"rules": [rule...]} appends rules; a rule is
         {"prefix": "pay_", "fault": F, "times": N, "probability": P, "latency_ms": MS}
         prefix matches the payment (metadata[payment_id], else the Idempotency-Key), or for a
         refund its refund id (metadata[refund_id], else the Idempotency-Key)
         F: latency | delay_after_commit | 429 | 500_after_commit | drop_after_commit | down
            | cached_500 (commit, then answer 500 and replay that 500 for the key, as Stripe does
              once execution began) | forget_after (the key is forgotten latency_ms after its
              first use, like Stripe's 24 h key retention; not a per-call fault)
         times: per key, how many calls the rule hits (default unlimited); probability: per call
  DELETE /_sim/faults[?prefix=P]  clears every rule (or those with exactly this prefix)
  POST   /_sim/reset             clears ledger, keys and rules

Run: simulator.py --port 0 --port-file FILE [--api-key sk_test_local] [--seed N]
                  [--key-retention-seconds 86400]
"""

import argparse
import hashlib
import json
import random
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

LOCK = threading.Lock()
STATE = {
    "keys": {},  # key -> {"params": hash, "state": "in_flight"|"done", "status": int, "body": str}
    "charges": {},  # key -> [intent]
    "declines": {},  # key -> [error]
    "calls": {},  # key -> number of POSTs received
    "intents": {},  # payment -> every intent created (for search)
    "refunds": {},  # refund id -> [refund]
    "refund_calls": {},  # refund id -> number of POSTs received
    "intent_refunds": {},  # intent id -> [refund] (for the list, and what is left to refund)
    "rules": [],
    "hits": {},  # (rule index, key) -> times hit
}
CONFIG = {"api_key": "sk_test_local", "rng": random.Random(0), "key_retention_ms": 86_400_000}
SEARCH_QUERY = re.compile(r"^metadata\['payment_id'\]:'([^']*)'$")


def params_hash(pairs):
    return hashlib.sha256(json.dumps(sorted(pairs)).encode()).hexdigest()


def retention_ms(payment):
    """How long the key of this payment is remembered (under LOCK)."""
    ms = CONFIG["key_retention_ms"]
    for rule in STATE["rules"]:
        if rule.get("fault") == "forget_after" and payment.startswith(rule.get("prefix", "")):
            ms = min(ms, rule.get("latency_ms", ms))
    return ms


def pick_fault(key):
    """The first per-call rule that matches this call, counting its hit (under LOCK)."""
    for i, rule in enumerate(STATE["rules"]):
        if rule.get("fault") == "forget_after" or not key.startswith(rule.get("prefix", "")):
            continue
        times = rule.get("times")
        hit_key = (i, key)
        if times is not None and STATE["hits"].get(hit_key, 0) >= times:
            continue
        if CONFIG["rng"].random() >= rule.get("probability", 1.0):
            continue
        STATE["hits"][hit_key] = STATE["hits"].get(hit_key, 0) + 1
        return rule
    return None


def error_body(kind, message, code=None, decline_code=None, intent=None):
    err = {"type": kind, "message": message}
    if code:
        err["code"] = code
    if decline_code:
        err["decline_code"] = decline_code
    if intent:
        err["payment_intent"] = intent
    return json.dumps({"error": err})


def find_intent(intent_id):
    """The intent with this id, across every payment (under LOCK)."""
    for intents in STATE["intents"].values():
        for intent in intents:
            if intent["id"] == intent_id:
                return intent
    return None


def execute_refund(form, refund_key):
    """Runs a refund; returns (status, body) and books the ledger (under LOCK)."""
    intent_id = form.get("payment_intent", "")
    intent = find_intent(intent_id)
    if intent is None:
        return 400, error_body("invalid_request_error", f"No such payment_intent: '{intent_id}'", code="resource_missing")
    if intent.get("status") != "succeeded":
        return 400, error_body("invalid_request_error", f"PaymentIntent {intent_id} has no successful charge to refund.", code="charge_not_refundable")
    refunds = STATE["intent_refunds"].setdefault(intent_id, [])
    left = intent["amount"] - sum(r["amount"] for r in refunds)
    if left <= 0:
        return 400, error_body("invalid_request_error", f"Charge for {intent_id} has already been refunded.", code="charge_already_refunded")
    amount = int(form.get("amount") or left)
    if amount > left:
        return 400, error_body("invalid_request_error", f"Refund amount ({amount}) is greater than unrefunded amount on charge ({left})", code="amount_too_large")
    refund = {
        "id": "re_" + hashlib.sha256(f"{refund_key}:{time.time_ns()}".encode()).hexdigest()[:24],
        "object": "refund",
        "amount": amount,
        "currency": intent["currency"],
        "payment_intent": intent_id,
        "reason": form.get("reason"),
        "status": "succeeded",
        "metadata": {k[9:-1]: v for k, v in form.items() if k.startswith("metadata[")},
        "created": int(time.time()),
    }
    refunds.append(refund)
    STATE["refunds"].setdefault(refund_key, []).append(refund)
    return 200, json.dumps(refund)


def execute(form, key):
    """Runs the payment; returns (status, body) and books the ledger (under LOCK)."""
    pm = form.get("payment_method", "")
    intent_id = "pi_" + hashlib.sha256(f"{key}:{time.time_ns()}".encode()).hexdigest()[:24]
    intent = {
        "id": intent_id,
        "object": "payment_intent",
        "amount": int(form.get("amount", "0")),
        "currency": form.get("currency"),
        "customer": form.get("customer"),
        "metadata": {k[9:-1]: v for k, v in form.items() if k.startswith("metadata[")},
        "created": int(time.time()),
    }
    if pm == "pm_card_invalid":
        return 400, error_body("invalid_request_error", "No such PaymentMethod: 'pm_card_invalid'", code="resource_missing")
    if pm in ("pm_card_chargeDeclined", "pm_card_chargeDeclinedInsufficientFunds"):
        decline = "insufficient_funds" if pm.endswith("InsufficientFunds") else "generic_decline"
        intent["status"] = "requires_payment_method"
        STATE["declines"].setdefault(key, []).append({"decline_code": decline, "intent": intent_id})
        STATE["intents"].setdefault(key, []).append(intent)
        return 402, error_body("card_error", "Your card was declined.", code="card_declined", decline_code=decline, intent={"id": intent_id})
    intent["status"] = "requires_action" if pm == "pm_card_threeDSecureRequired" else "succeeded"
    STATE["charges"].setdefault(key, []).append(intent)
    STATE["intents"].setdefault(key, []).append(intent)
    return 200, json.dumps(intent)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes; with Nagle's algorithm the body would wait for the
    # client's delayed ACK of the headers (40 ms on Linux) on every kept-alive connection.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # quiet: the ledger is the record
        pass

    def reply(self, status, body, headers=None):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def drop(self):
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n).decode() if n else ""

    # --- control API -------------------------------------------------------------------------
    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/_sim/health":
            return self.reply(200, '{"ok": true}')
        if url.path == "/v1/payment_intents/search":
            return self.search(dict(parse_qsl(url.query)))
        if url.path == "/v1/refunds":
            return self.list_refunds(dict(parse_qsl(url.query)))
        if url.path == "/_sim/ledger":
            q = dict(parse_qsl(url.query))
            with LOCK:
                snap = {n: STATE[n] for n in ("charges", "declines", "calls", "refunds", "refund_calls")}
                if "key" in q:
                    snap = {n: {q["key"]: v[q["key"]]} if q["key"] in v else {} for n, v in snap.items()}
                return self.reply(200, json.dumps(snap))
        return self.reply(404, error_body("invalid_request_error", "Unrecognized request URL"))

    def do_DELETE(self):
        url = urlsplit(self.path)
        if url.path == "/_sim/faults":
            self.body()
            prefix = dict(parse_qsl(url.query)).get("prefix")
            with LOCK:
                if prefix is None:
                    STATE["rules"] = []
                    STATE["hits"] = {}
                else:
                    # Disable, not remove: rule indexes key the hit counts.
                    for rule in STATE["rules"]:
                        if rule.get("prefix", "") == prefix:
                            rule["times"] = 0
            return self.reply(200, '{"ok": true}')
        return self.reply(404, error_body("invalid_request_error", "Unrecognized request URL"))

    def do_POST(self):
        path = urlsplit(self.path).path
        if path == "/_sim/faults":
            rules = json.loads(self.body() or "{}").get("rules", [])
            with LOCK:
                STATE["rules"].extend(rules)
            return self.reply(200, json.dumps({"rules": len(STATE["rules"])}))
        if path == "/_sim/reset":
            self.body()
            with LOCK:
                for n in ("keys", "charges", "declines", "calls", "hits", "intents", "refunds", "refund_calls", "intent_refunds"):
                    STATE[n] = {}
                STATE["rules"] = []
            return self.reply(200, '{"ok": true}')
        if path == "/v1/payment_intents":
            return self.idempotent_post("metadata[payment_id]", "calls", execute)
        if path == "/v1/refunds":
            return self.idempotent_post("metadata[refund_id]", "refund_calls", execute_refund)
        self.body()
        return self.reply(404, error_body("invalid_request_error", "Unrecognized request URL"))

    # --- Stripe API --------------------------------------------------------------------------
    def search(self, q):
        if self.headers.get("Authorization") != "Bearer " + CONFIG["api_key"]:
            return self.reply(401, error_body("invalid_request_error", "Invalid API Key provided"))
        m = SEARCH_QUERY.match(q.get("query", ""))
        if not m:
            return self.reply(400, error_body("invalid_request_error", "This simulator searches metadata['payment_id'] only"))
        with LOCK:
            # An outage ("down") takes search down too; per-call faults are not consumed here.
            if any(r.get("fault") == "down" and r.get("times") != 0 and m.group(1).startswith(r.get("prefix", ""))
                   for r in STATE["rules"]):
                return self.reply(503, error_body("api_error", "Service unavailable"))
            data = list(STATE["intents"].get(m.group(1), []))
        return self.reply(200, json.dumps({"object": "search_result", "data": data, "has_more": False, "url": "/v1/payment_intents/search"}))

    def list_refunds(self, q):
        if self.headers.get("Authorization") != "Bearer " + CONFIG["api_key"]:
            return self.reply(401, error_body("invalid_request_error", "Invalid API Key provided"))
        intent_id = q.get("payment_intent", "")
        with LOCK:
            data = list(STATE["intent_refunds"].get(intent_id, []))
            # An outage ("down") for one of these refunds takes the list down too.
            down = any(r.get("fault") == "down" and r.get("times") != 0
                       and any(x["metadata"].get("refund_id", "").startswith(r.get("prefix", "")) for x in data)
                       for r in STATE["rules"])
            if down or any(r.get("fault") == "down" and r.get("times") != 0 and r.get("prefix", "") == "" for r in STATE["rules"]):
                return self.reply(503, error_body("api_error", "Service unavailable"))
        return self.reply(200, json.dumps({"object": "list", "data": data, "has_more": False, "url": "/v1/refunds"}))

    def idempotent_post(self, book_field, calls_field, run):
        """Stripe's idempotency around `run(form, book_key)`: the books and the fault rules are
        keyed by the form's `book_field` (the Idempotency-Key when absent)."""
        raw = self.body()
        if self.headers.get("Authorization") != "Bearer " + CONFIG["api_key"]:
            return self.reply(401, error_body("invalid_request_error", "Invalid API Key provided"))
        pairs = parse_qsl(raw, keep_blank_values=True)
        form = dict(pairs)
        key = self.headers.get("Idempotency-Key")
        if not key:
            # The processor always sends one; without it a retry could charge twice.
            return self.reply(400, error_body("invalid_request_error", "Idempotency-Key header is required by this simulator"))
        # Stripe compares a key's requests by endpoint and parameters.
        h = params_hash(pairs + [("__path__", urlsplit(self.path).path)])
        # The books are kept per payment (metadata[payment_id]), not per key, so that a client
        # that sends another key for the same payment shows up as a double charge (the same for
        # refunds, by metadata[refund_id]).
        payment = form.get(book_field) or key
        with LOCK:
            STATE[calls_field][payment] = STATE[calls_field].get(payment, 0) + 1
            rule = pick_fault(payment)
            fault = rule.get("fault") if rule else None
            if fault == "down":
                return self.reply(503, error_body("api_error", "Service unavailable"), {"Stripe-Should-Retry": "true"})
            if fault == "429":
                return self.reply(429, error_body("rate_limit_error", "Too many requests"), {"Retry-After": "1"})
            entry = STATE["keys"].get(key)
            if entry is not None and (time.time() * 1000 - entry["created_ms"]) > retention_ms(payment):
                del STATE["keys"][key]  # forgotten, as Stripe forgets keys after 24 hours
                entry = None
            if entry is not None:
                if entry["params"] != h:
                    return self.reply(400, error_body(
                        "idempotency_error",
                        "Keys for idempotent requests can only be used with the same parameters they were first used with."))
                if entry["state"] == "in_flight":
                    return self.reply(409, error_body(
                        "idempotency_error", "There is currently another in-progress request using this Idempotent Key."),
                        {"Stripe-Should-Retry": "true"})
                return self.reply(entry["status"], entry["body"], {"Idempotent-Replayed": "true"})
            STATE["keys"][key] = {"params": h, "state": "in_flight", "created_ms": time.time() * 1000}
        if fault == "latency":
            time.sleep(rule.get("latency_ms", 1000) / 1000)
        with LOCK:
            status, body = run(form, payment)
            # The answer is stored before it is sent: a replay returns it even if this
            # connection drops or this answer is replaced by a 500 below.
            STATE["keys"][key].update(state="done", status=status, body=body)
        if fault == "delay_after_commit":
            time.sleep(rule.get("latency_ms", 1000) / 1000)
        if fault == "cached_500":
            err = error_body("api_error", "Internal server error")
            with LOCK:
                STATE["keys"][key].update(status=500, body=err)
            return self.reply(500, err, {"Stripe-Should-Retry": "false"})
        if fault == "500_after_commit":
            return self.reply(500, error_body("api_error", "Internal server error"), {"Stripe-Should-Retry": "true"})
        if fault == "drop_after_commit":
            return self.drop()
        return self.reply(status, body)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        # Clients that die mid-request (the chaos checker kills them) are expected here.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--api-key", default="sk_test_local")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault dice")
    ap.add_argument("--key-retention-seconds", type=float, default=86400, help="how long idempotency keys are remembered")
    args = ap.parse_args()
    CONFIG["api_key"] = args.api_key
    CONFIG["rng"] = random.Random(args.seed)
    CONFIG["key_retention_ms"] = args.key_retention_seconds * 1000
    server = Server((args.host, args.port), Handler)
    port = server.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os

        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"provider simulator listening on http://{args.host}:{port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
