#!/usr/bin/env python3
"""A Stripe-compatible payment provider simulator with fault injection.

It speaks the subset of Stripe's API that the processor uses, with Stripe's idempotency
semantics and what a current account refuses, and keeps a ledger of every charge per payment so
that tests and the demo can check "charged exactly once" against the provider's own books,
never the processor's. Where it and Stripe's documentation disagree, it is wrong.

Every /v1 request is answered as the account's API version answers it: the request's
`Stripe-Version`, else the account's default (--account-api-version, default the version the
project pins). A malformed version is refused with 400, as Stripe refuses it.

API (Stripe's wire format):
  POST /v1/payment_intents            form body, Authorization: Bearer <key>, Idempotency-Key
      - same key, same parameters: the stored answer again, with Idempotent-Replayed: true
      - same key, other parameters: 400 idempotency_error; the key used on another endpoint:
        400 idempotency_error naming both endpoints (Stripe's keys are account-wide)
      - same key while the first request runs: 409
      - on versions >= 2023-08-16, confirm=true needs off_session=true, a return_url, or
        automatic_payment_methods[allow_redirects]=never (or payment_method_types): else 400
        with Stripe's message ("A `return_url` must be specified ..."); older versions keep the
        old default (no automatic payment methods)
      - amount below Stripe's minimum for the currency (USD 0.50, ...): 400 amount_too_small;
        above 99999999: 400 amount_too_large; a three-decimal currency not ending in 0: 400
      - metadata: more than 50 keys, a key over 40 characters or with [ ], a value over 500:
        400 parameter_invalid; an empty value unsets the key (it is not stored)
      - without confirm=true the intent is only created: requires_payment_method (no
        payment_method) or requires_confirmation, nothing charged
      - payment_method decides the result (Stripe's test methods):
        pm_card_visa (and any other pm_*) -> 200 succeeded
        pm_card_chargeDeclined -> 402 card_declined / generic_decline; ...InsufficientFunds,
          ...LostCard, ...StolenCard, ...Fraudulent, ...VelocityLimitExceeded -> card_declined
          with that decline code; ...ExpiredCard, ...IncorrectCvc, ...ProcessingError -> 402
          with code expired_card / incorrect_cvc / processing_error
        pm_card_authenticationRequired, pm_card_threeDSecure2Required,
        pm_card_threeDSecureRequired -> off-session: 402 card_error authentication_required
          (the intent stays requires_payment_method); on-session: 200 requires_action
        pm_card_invalid -> 400 invalid_request_error / resource_missing
        pm_usBankAccount_success -> 200 processing, then succeeded after --settle-seconds;
          pm_usBankAccount_accountClosed / _insufficientFunds / _debitNotAuthorized -> 200
          processing, then requires_payment_method with that failure code (Stripe's ACH tests)
        pm_card_refundFail -> succeeded; each of its refunds is created pending and fails later
          (failure_reason expired_or_canceled_card), as Stripe's test card does
        pm_card_createDispute -> succeeded; a dispute (needs_response, the full amount) opens later
  POST /v1/payment_intents/PI/confirm payment_method?: the merchant confirms again on-session
                                      (from requires_payment_method / requires_confirmation /
                                      requires_action, else 400 payment_intent_unexpected_state):
                                      succeeded, booked under its metadata[payment_id]
  POST /v1/payment_intents/PI/cancel cancellation_reason?: canceled for good (from
                                      requires_payment_method / requires_capture /
                                      requires_confirmation / requires_action, else 400
                                      payment_intent_unexpected_state); payment_intent.canceled
  GET  /v1/payment_intents            customer, created[gte|gt|lte|lt], limit, starting_after:
                                      the customer's intents, newest first (Stripe's list)
  GET  /v1/payment_intents/search     query=metadata['payment_id']:'P' (Stripe's search shape)
  GET  /v1/payment_intents/PI         one intent
  POST /v1/customers                  creates a customer (for payctl smoke)

  POST /v1/refunds                    form body (payment_intent, amount?, reason?, metadata[...]),
                                      Idempotency-Key, the same idempotency semantics
      - payment_intent unknown -> 400 resource_missing; not succeeded -> 400 charge_not_refundable
      - amount (default: what is left) above what is left -> 400 amount_too_large;
        nothing left -> 400 charge_already_refunded; else 200 refund (status succeeded)
      - a charge with an open or lost dispute -> 400 charge_disputed; failed refunds return
        their amount to what is left
  GET  /v1/refunds?payment_intent=PI  every refund of the intent (Stripe's list shape)
  GET  /v1/refunds/RE, /v1/disputes/DP, /v1/charges/CH, /v1/events/EVT   one object
  GET  /v1/charges, /v1/disputes      the account's, newest first (limit)
  POST /_sim/account {"api_version"}  the account's default version, which events are rendered in
  GET  /v1/webhook_endpoints          the endpoint it sends to and the others set (limit, starting_after)
  Restricted keys (POST /_sim/keys {"rk_test_...": {"refunds": "read", ...}}): a request for a
  resource the key may not read (GET) or write (POST, DELETE) is 403 with Stripe's message
  POST /v1/webhook_endpoints[/WE], GET and DELETE /v1/webhook_endpoints/WE: Stripe's endpoint
                                      API (endpoints.py); the first registered while none is set is
                                      the one sent to, signed with its secret
  GET  /v1/events                     created[gte|gt|lte|lt], type (or a prefix.*), types[], limit,
                                      starting_after: every event, newest first (Stripe's list)

Events (events.py): every state change is an event (payment_intent.created / .processing /
.requires_action / .succeeded / .payment_failed, charge.refunded, refund.created / .updated /
.failed, charge.dispute.created / .funds_withdrawn / .closed / .funds_reinstated), kept for
GET /v1/events and delivered to --webhook-url signed with --webhook-secret, at least once, in
no promised order, retried with backoff while the endpoint answers non-2xx.

Control API (not Stripe's):
  GET    /_sim/health
  GET    /_sim/ledger[?key=P]    {"charges": {P: [intent...]}, "charged_at_ms": {P: [ms...]}, "declines": {...}, "actions": {...},
                                  "calls": {P: n}, "refunds": {R: [refund...]}, "refund_calls": {R: n}}
         booked per payment: P is metadata[payment_id] (the Idempotency-Key when absent); charges
         are succeeded intents only; actions are intents waiting for the customer; refunds per
         refund: R is metadata[refund_id] (the Idempotency-Key when absent)
  POST   /_sim/faults            {"rules": [rule...]} appends rules; a rule is
         {"prefix": "pay_", "fault": F, "times": N, "probability": P, "latency_ms": MS}
         prefix matches the payment (metadata[payment_id], else the Idempotency-Key), or for a
         refund its refund id (metadata[refund_id], else the Idempotency-Key)
         F: latency | delay_after_commit | 429 | lock_timeout (a 429 for the object, code
            lock_timeout, no Stripe-Rate-Limited-Reason) | 500_after_commit | drop_after_commit | down
            | cached_500 (commit, then answer 500 and replay that 500 for the key, as Stripe does
              once execution began) | forget_after (the key is forgotten latency_ms after its
              first use, like Stripe's 24 h key retention; not a per-call fault)
         times: per key, how many calls the rule hits (default unlimited); probability: per call
  DELETE /_sim/faults[?prefix=P]  clears every rule (or those with exactly this prefix)
  POST   /_sim/reset             clears ledger, keys, rules and events
  POST   /_sim/webhook           the endpoint and its delivery faults (see events.py)
  POST   /_sim/events/history    {"count": N, "since": S, "until": U, "type": T}: the account's
                                 other traffic, N events delivered to every endpoint
  POST   /_sim/events/undelivered {"ids": [evt...]}: these failed every delivery attempt
  GET    /_sim/deliveries        per event id: attempts, delivered, the statuses answered
  POST   /_sim/settle            {"seconds": S}: how long the provider takes to finish on its own
  POST   /_sim/latency           {"p50_ms": M, "p99_ms": N}: every /v1 answer after a seeded
                                 log-normal time (--latency; 0: at once)
  POST   /_sim/disputes/open {"payment_intent": PI}: the cardholder disputes a charge made before
  POST   /_sim/disputes/DP/close {"won": true|false}: the network's decision
  POST   /_sim/rate_limit        {"per_second": R, "endpoint_per_second": E}: the account's limits,
                                 as Stripe's: at most R /v1 requests a second in all and E to
                                 each endpoint (a method and a path with its ids left out:
                                 POST /v1/payment_intents and GET /v1/payment_intents/{id} are
                                 two), each a token bucket holding one second's worth; the rest
                                 answered 429 (code rate_limit) with Stripe-Rate-Limited-Reason
                                 global-rate or endpoint-rate. E defaults to Stripe's 25 (0: none);
                                 R 0: no limit at all, the default
  GET    /_sim/rate_limit        {"per_second", "endpoint_per_second", "allowed", "refused",
                                 "refused_by_reason"}: the /v1 requests let through and refused
                                 since the limits were set

A request refused by validation (amount, metadata, the return_url rule) saves no result for its
key, as at Stripe: the same key may then be used with corrected parameters.

Run: simulator.py --port 0 --port-file FILE [--api-key sk_test_local] [--seed N]
                  [--key-retention-seconds 86400] [--account-api-version V] [--record FILE]
--record appends every /v1 request (method, path, query, body, Stripe-Version, Idempotency-Key)
as a JSON line: the contract test checks them against Stripe's own parameter definitions.
"""

import argparse
import hashlib
import json
import os
import math
import random
import re
import socket
import sys
import threading
import string
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import endpoints
import events

LOCK = threading.Lock()
# A Request-Id's characters after its req_ prefix.
REQUEST_ID_CHARS = string.ascii_letters + string.digits
# The account's rate limits (POST /_sim/rate_limit): token buckets of one second's requests, one
# for the account and one per endpoint.
RATE = {"per_second": 0.0, "endpoint_per_second": 0.0, "buckets": {}, "allowed": 0, "refused": 0,
        "refused_by_reason": {}}

# Stripe's default limit of each endpoint, requests a second (docs.stripe.com/rate-limits).
DEFAULT_ENDPOINT_PER_SECOND = 25.0


# An object's id in a path: a prefix, an underscore, and letters with a digit or a capital
# (pi_3MtwBw..., ch_merchant_1); collections and actions (search, confirm, line_items) are words.
OBJECT_ID = re.compile(r"[a-z]+_[A-Za-z0-9_]*[0-9A-Z][A-Za-z0-9_]*")


def endpoint_of(method, path):
    """The endpoint a request counts against: its method and path, with objects' ids left out
    (/v1/payment_intents/pi_1/confirm is POST /v1/payment_intents/{id}/confirm, and
    GET /v1/payment_intents/search an endpoint of its own)."""
    parts = [("{id}" if i >= 2 and OBJECT_ID.fullmatch(p) else p)
             for i, p in enumerate(path.strip("/").split("/"))]
    return method + " /" + "/".join(parts)


def take_rate_token(endpoint):
    """None when a /v1 request arriving now to `endpoint` is within the account's limits (always,
    with none); else the reason it is refused (global-rate, endpoint-rate)."""
    with LOCK:
        rate = RATE["per_second"]
        if rate <= 0:
            return None
        now = time.monotonic()
        limits = [("global-rate", "", rate)]
        if RATE["endpoint_per_second"] > 0:
            limits.append(("endpoint-rate", endpoint, RATE["endpoint_per_second"]))
        buckets = []
        for reason, name, per_second in limits:
            tokens, at = RATE["buckets"].get(name, (per_second, now))
            tokens = min(per_second, tokens + (now - at) * per_second)
            buckets.append((reason, name, tokens))
        for reason, name, tokens in buckets:
            if tokens < 1:
                RATE["refused"] += 1
                RATE["refused_by_reason"][reason] = RATE["refused_by_reason"].get(reason, 0) + 1
                for _, n, t in buckets:
                    RATE["buckets"][n] = (t, now)
                return reason
        for _, name, tokens in buckets:
            RATE["buckets"][name] = (tokens - 1, now)
        RATE["allowed"] += 1
        return None

STATE = {
    "keys": {},  # key -> {"params": hash, "state": "in_flight"|"done", "status": int, "body": str}
    "charges": {},  # key -> [intent]
    "charged_at_ms": {},  # key -> [epoch ms each charge was booked] (the benchmark's send -> charged)
    "declines": {},  # key -> [error]
    "calls": {},  # key -> number of POSTs received
    "intents": {},  # payment -> every intent created (for search)
    "refunds": {},  # refund id -> [refund]
    "refund_calls": {},  # refund id -> number of POSTs received
    "intent_refunds": {},  # intent id -> [refund] (for the list, and what is left to refund)
    "actions": {},  # key -> [intent waiting for the customer]
    "customers": {},  # customer id -> customer
    "charges_by_id": {},  # charge id -> charge (the charge of each succeeded intent)
    "disputes": {},  # dispute id -> dispute
    "all_intents": [],  # every intent in creation order (for the list by customer)
    "rules": [],
    "hits": {},  # (rule index, key) -> times hit
}
CONFIG = {"api_key": "sk_test_local", "rng": random.Random(0), "latency_rng": random.Random(0), "key_retention_ms": 86_400_000,
          "account_version": "2026-10-28.endive", "record": None, "restricted": {},
          # The account's statement descriptor prefix (Dashboard, Public details): a card charge's
          # suffix fits 22 characters with it.
          "statement_descriptor_prefix": "SIMSHOP", "settle_s": 2.0,
          "latency": None}  # (mu, sigma) of a log-normal answer time in ms, or None: at once
SEARCH_QUERY = re.compile(r"^metadata\['payment_id'\]:'([^']*)'$")
API_VERSION = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(\.[a-z]+)?$")
# From this version on, a PaymentIntent accepts the Dashboard's payment methods by default, so a
# confirmation needs a return_url unless it is off-session or refuses redirects (changelog).
AUTOMATIC_PAYMENT_METHODS_SINCE = "2023-08-16"
RETURN_URL_MESSAGE = (
    "A `return_url` must be specified because this Payment Intent is configured to automatically "
    "accept the payment methods enabled in the Dashboard, some of which may require a full page "
    "redirect to succeed. If you do not want to accept redirect-based payment methods, set "
    "`automatic_payment_methods[enabled]` to `true` and `automatic_payment_methods[allow_redirects]` "
    "to `never` when creating Setup Intents and Payment Intents.")
# Stripe's amount rules per currency, one stored list shared with the contract check.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "contract"))
from stripe_currencies import MINIMUMS, THREE_DECIMAL, WHOLE_UNITS, ZERO_DECIMAL, display, least, maximum  # noqa: E402
# Stripe's test payment methods that decline: (code, decline_code).
DECLINES = {
    "pm_card_chargeDeclined": ("card_declined", "generic_decline"),
    "pm_card_chargeDeclinedInsufficientFunds": ("card_declined", "insufficient_funds"),
    "pm_card_chargeDeclinedLostCard": ("card_declined", "lost_card"),
    "pm_card_chargeDeclinedStolenCard": ("card_declined", "stolen_card"),
    "pm_card_chargeDeclinedFraudulent": ("card_declined", "fraudulent"),
    "pm_card_chargeDeclinedVelocityLimitExceeded": ("card_declined", "card_velocity_exceeded"),
    "pm_card_chargeDeclinedExpiredCard": ("expired_card", "expired_card"),
    "pm_card_chargeDeclinedIncorrectCvc": ("incorrect_cvc", "incorrect_cvc"),
    "pm_card_chargeDeclinedProcessingError": ("processing_error", "processing_error"),
}
NEEDS_AUTHENTICATION = {"pm_card_authenticationRequired", "pm_card_threeDSecure2Required", "pm_card_threeDSecureRequired"}
# Stripe's ACH Direct Debit test payment methods: a delayed-notification method, `processing`
# at confirmation and settled later (here after --settle-seconds): to `succeeded`, or back to
# `requires_payment_method` with the bank's failure code.
DELAYED = {"pm_usBankAccount_success": None, "pm_usBankAccount_accountClosed": "account_closed",
           "pm_usBankAccount_insufficientFunds": "insufficient_funds",
           "pm_usBankAccount_debitNotAuthorized": "debit_not_authorized"}
# Stripe's test cards whose charge succeeds and then: every refund fails asynchronously
# (created `pending`, `failed` with expired_or_canceled_card later); a dispute opens.
REFUND_FAILS = "pm_card_refundFail"
DISPUTED = "pm_card_createDispute"
# Dispute statuses in which Stripe holds the disputed amount and refuses refunds.
DISPUTE_HOLDS = {"needs_response", "under_review", "lost"}


# z of the 99th percentile of a standard normal.
Z99 = 2.326347874


def latency_model(p50_ms, p99_ms):
    """The log-normal answer time with this median and 99th percentile: (mu, sigma) of the
    underlying normal, or None for answers at once."""
    if p50_ms <= 0:
        return None
    if p99_ms < p50_ms:
        raise ValueError("the 99th percentile is below the median")
    return math.log(p50_ms), math.log(p99_ms / p50_ms) / Z99


def latency_ms(model, rng):
    """One answer time drawn from the model (0 without one)."""
    return 0.0 if model is None else rng.lognormvariate(*model)


def version_of(headers):
    """The request's API version (the account's default without a header), or None if malformed."""
    v = headers.get("Stripe-Version") or CONFIG["account_version"]
    return v if API_VERSION.match(v.strip()) else None


def at_least(version, since):
    return version[:10] >= since


def invalid(message, param=None, code="parameter_invalid"):
    err = {"type": "invalid_request_error", "message": message, "code": code}
    if param:
        err["param"] = param
    return 400, json.dumps({"error": err})


def whole_units_refused(currency):
    """Stripe's answer to a fraction of a whole-units currency (ISK, UGX), charge or refund."""
    return invalid(f"Invalid amount. Currency {currency.upper()} has become effectively zero-decimal and charged amounts "
                   f"must be evenly divisible by 100. See https://stripe.com/docs/currencies#special-cases for more "
                   f"information.", "amount", "invalid_charge_amount_no_decimal_compatible")


def check_payment_intent(form, version):
    """What a current account refuses in a PaymentIntent creation: (status, body) or None."""
    currency = (form.get("currency") or "").lower()
    try:
        amount = int(form.get("amount", ""))
    except ValueError:
        return invalid("Invalid integer: " + form.get("amount", ""), "amount", "parameter_invalid_integer")
    if amount < least(currency):
        return invalid(f"Amount must be at least {display(least(currency), currency)}", "amount", "amount_too_small")
    if amount > maximum(currency):
        return invalid(f"Amount must be no more than {display(maximum(currency), currency)}", "amount", "amount_too_large")
    if currency in WHOLE_UNITS and amount % 100:
        return whole_units_refused(currency)
    if currency in THREE_DECIMAL and amount % 10:
        return invalid(f"Invalid amount: amounts in {currency.upper()} must be divisible by 10", "amount", "invalid_amount")
    refused = check_metadata(form)
    if refused:
        return refused
    description = form.get("description")
    if description is not None and len(description) > 1000:
        return invalid("Invalid string: description must be at most 1000 characters", "description")
    suffix = form.get("statement_descriptor_suffix")
    if suffix is not None:
        # Stripe's rules: Latin, no < > \ ' " *, a letter at least, and the account's prefix,
        # "*", a space and the suffix in 22 characters.
        prefix = CONFIG["statement_descriptor_prefix"]
        if (not suffix or any(c in suffix for c in "<>\\'\"*") or not any(c.isascii() and c.isalpha() for c in suffix)
                or not all(c.isascii() and (c.isprintable()) for c in suffix)):
            return invalid("Invalid statement_descriptor_suffix: it must contain at least one letter and none of "
                           "< > \\ ' \" *", "statement_descriptor_suffix")
        if len(prefix) + 2 + len(suffix) > 22:
            return invalid(f"The statement descriptor prefix '{prefix}' and suffix together must be at most 22 "
                           "characters, with the '* ' between them", "statement_descriptor_suffix")
    if form.get("confirm") == "true" and at_least(version, AUTOMATIC_PAYMENT_METHODS_SINCE):
        off_session = form.get("off_session") in ("true", "one_off", "recurring")
        no_redirects = form.get("automatic_payment_methods[allow_redirects]") == "never"
        listed = any(k.startswith("payment_method_types[") for k in form)
        if not (off_session or form.get("return_url") or no_redirects or listed):
            return 400, json.dumps({"error": {"type": "invalid_request_error", "message": RETURN_URL_MESSAGE}})
    return None


def check_metadata(form):
    keys = [k[9:-1] for k in form if k.startswith("metadata[") and k.endswith("]")]
    if len(keys) > 50:
        return invalid("You can have at most 50 keys in metadata.", "metadata")
    for k in keys:
        if not k or "[" in k or "]" in k:
            return invalid(f"Invalid metadata key: {k!r}", f"metadata[{k}]")
        if len(k) > 40:
            return invalid("Metadata keys can have up to 40 characters.", f"metadata[{k}]")
        if len(form[f"metadata[{k}]"]) > 500:
            return invalid("Metadata values can have up to 500 characters.", f"metadata[{k}]")
    return None


def metadata_of(form):
    """The metadata Stripe stores: an empty value unsets its key."""
    return {k[9:-1]: v for k, v in form.items() if k.startswith("metadata[") and k.endswith("]") and v != ""}


def record(entry):
    """Appends one /v1 request to the --record file (opened once, line-buffered)."""
    if CONFIG["record"]:
        with LOCK:
            CONFIG["record"].write(json.dumps(entry) + "\n")


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


def emit(kind, obj, key=None):
    """Records and sends the event of a state change (under LOCK)."""
    return events.emit(kind, obj, CONFIG["account_version"], key)


def later(fn, *args):
    """Runs fn(*args) under LOCK after the settle delay (the provider finishing on its own)."""
    def run():
        with LOCK:
            fn(*args)
    t = threading.Timer(CONFIG["settle_s"], run)
    t.daemon = True
    t.start()


def charge_of(intent):
    """Books the charge of a succeeded intent (under LOCK)."""
    ch = "ch_" + intent["id"][3:]
    intent["latest_charge"] = ch
    STATE["charges_by_id"][ch] = {"id": ch, "object": "charge", "amount": intent["amount"], "currency": intent["currency"],
                                  "payment_intent": intent["id"], "metadata": dict(intent["metadata"]), "status": "succeeded",
                                  "created": int(time.time()), "livemode": False}
    return ch


def succeed(intent, key):
    """An intent that succeeded: its charge booked and its events sent (under LOCK)."""
    intent["status"] = "succeeded"
    charge_of(intent)
    STATE["charges"].setdefault(key, []).append(intent)
    STATE["charged_at_ms"].setdefault(key, []).append(int(time.time() * 1000))
    emit("payment_intent.succeeded", intent)
    if intent.get("payment_method") == DISPUTED:
        later(open_dispute, intent)


def confirm_intent(intent_id, form):
    """`POST /v1/payment_intents/PI/confirm` (under LOCK): the merchant confirms again with the
    customer present (on-session), e.g. after an off-session payment needed authentication.
    Confirmable from requires_payment_method, requires_confirmation or requires_action, else
    400 payment_intent_unexpected_state, as Stripe answers. With a payment method that needs no
    authentication (the customer authenticated, or gave another card) it succeeds and its
    charge is booked under the payment's metadata[payment_id]; a declining method declines."""
    intent = find_intent(intent_id)
    if intent is None:
        return 400, error_body("invalid_request_error", f"No such payment_intent: '{intent_id}'", code="resource_missing"), False
    if intent["status"] not in ("requires_payment_method", "requires_confirmation", "requires_action"):
        return 400, error_body("invalid_request_error",
                               f"This PaymentIntent's status is {intent['status']}, but it must be one of "
                               "requires_payment_method, requires_confirmation, requires_action to be confirmed.",
                               code="payment_intent_unexpected_state")
    pm = form.get("payment_method") or intent.get("payment_method")
    if not pm:
        return 400, error_body("invalid_request_error",
                               "You cannot confirm this PaymentIntent because it's missing a payment method. You can "
                               "either update the PaymentIntent with a payment method and then confirm it again, or "
                               "confirm it again directly with a payment method.",
                               code="payment_intent_unexpected_state")
    intent["payment_method"] = pm
    intent.pop("last_payment_error", None)
    key = intent.get("metadata", {}).get("payment_id") or intent_id
    if pm in DECLINES:
        code, decline = DECLINES[pm]
        intent["status"] = "requires_payment_method"
        intent["last_payment_error"] = {"type": "card_error", "code": code, "decline_code": decline,
                                        "message": "Your card was declined."}
        emit("payment_intent.payment_failed", intent)
        return 402, error_body("card_error", "Your card was declined.", code=code, decline_code=decline,
                               intent={"id": intent_id, "object": "payment_intent", "status": "requires_payment_method"})
    succeed(intent, key)
    return 200, json.dumps(intent)


# Stripe's cancellation_reason values (stripe/params/_payment_intent_cancel_params.py).
CANCELLATION_REASONS = ("abandoned", "duplicate", "fraudulent", "requested_by_customer")
# What Stripe cancels ("You can cancel a PaymentIntent object when it's in one of these statuses:
# requires_payment_method, requires_capture, requires_confirmation, requires_action or, in rare
# cases, processing": the rare cases are not modelled, a processing debit is refused).
CANCELABLE = ("requires_payment_method", "requires_capture", "requires_confirmation", "requires_action")


def cancel_intent(intent_id, form):
    """`POST /v1/payment_intents/PI/cancel` (under LOCK): the merchant (an operator) ends a
    PaymentIntent that will never be paid; no charge is made by it after, and its
    `payment_intent.canceled` event is sent."""
    intent = find_intent(intent_id)
    if intent is None:
        return 400, error_body("invalid_request_error", f"No such payment_intent: '{intent_id}'", code="resource_missing"), False
    reason = form.get("cancellation_reason")
    if reason is not None and reason not in CANCELLATION_REASONS:
        return 400, error_body("invalid_request_error",
                               f"Invalid cancellation_reason: must be one of {', '.join(CANCELLATION_REASONS)}"), False
    if intent["status"] not in CANCELABLE:
        return 400, error_body("invalid_request_error",
                               f"You cannot cancel this PaymentIntent because it has a status of {intent['status']}. "
                               f"Only a PaymentIntent with one of the following statuses may be canceled: "
                               f"{', '.join(CANCELABLE)}.",
                               code="payment_intent_unexpected_state")
    intent["status"] = "canceled"
    intent["canceled_at"] = int(time.time())
    intent["cancellation_reason"] = reason
    emit("payment_intent.canceled", intent)
    return 200, json.dumps(intent)


def settle_delayed(intent, key, failure):
    """A delayed-notification payment settles (under LOCK)."""
    if find_intent(intent["id"]) is not intent or intent["status"] != "processing":
        return
    if failure is None:
        succeed(intent, key)
        return
    intent["status"] = "requires_payment_method"
    intent["last_payment_error"] = {"type": "invalid_request_error", "code": failure,
                                    "message": "The customer's bank could not debit the account."}
    STATE["declines"].setdefault(key, []).append({"decline_code": failure, "intent": intent["id"]})
    emit("payment_intent.payment_failed", intent)


def open_dispute(intent):
    """The cardholder disputes the charge (under LOCK)."""
    if find_intent(intent["id"]) is not intent:
        return
    dp = "dp_" + intent["id"][3:]
    dispute = {"id": dp, "object": "dispute", "amount": intent["amount"], "currency": intent["currency"],
               "charge": intent.get("latest_charge"), "payment_intent": intent["id"], "reason": "fraudulent",
               "status": "needs_response", "is_charge_refundable": False, "metadata": {},
               "created": int(time.time()), "livemode": False}
    STATE["disputes"][dp] = dispute
    emit("charge.dispute.created", dispute)
    emit("charge.dispute.funds_withdrawn", dispute)


def close_dispute(dp, won):
    """Closes a dispute as the card network decided (under LOCK): (status, body)."""
    dispute = STATE["disputes"].get(dp)
    if dispute is None:
        return 404, error_body("invalid_request_error", f"No such dispute: '{dp}'", code="resource_missing")
    if dispute["status"] in ("won", "lost"):
        return 400, error_body("invalid_request_error", f"Dispute {dp} is already closed.")
    dispute["status"] = "won" if won else "lost"
    emit("charge.dispute.closed", dispute)
    if won:
        emit("charge.dispute.funds_reinstated", dispute)
    return 200, json.dumps(dispute)


def fail_refund(refund):
    """A pending refund fails (under LOCK): the money is back on the charge."""
    if refund["status"] != "pending":
        return
    refund["status"] = "failed"
    refund["failure_reason"] = "expired_or_canceled_card"
    emit("refund.updated", refund)
    emit("refund.failed", refund)


def find_intent(intent_id):
    """The intent with this id, across every payment (under LOCK)."""
    for intents in STATE["intents"].values():
        for intent in intents:
            if intent["id"] == intent_id:
                return intent
    return None


def execute_refund(form, refund_key, version):
    """Runs a refund; returns (status, body) and books the ledger (under LOCK)."""
    intent_id = form.get("payment_intent", "")
    intent = find_intent(intent_id)
    if intent is None:
        return 400, error_body("invalid_request_error", f"No such payment_intent: '{intent_id}'", code="resource_missing")
    if intent.get("status") != "succeeded":
        return 400, error_body("invalid_request_error", f"PaymentIntent {intent_id} has no successful charge to refund.", code="charge_not_refundable")
    refunds = STATE["intent_refunds"].setdefault(intent_id, [])
    if any(d["payment_intent"] == intent_id and d["status"] in DISPUTE_HOLDS for d in STATE["disputes"].values()):
        return 400, error_body("invalid_request_error", f"Charge {intent.get('latest_charge')} has been charged back; cannot issue a refund.",
                               code="charge_disputed")
    # A failed or canceled refund returned nothing: its amount can be refunded again.
    left = intent["amount"] - sum(r["amount"] for r in refunds if r["status"] not in ("failed", "canceled"))
    if left <= 0:
        return 400, error_body("invalid_request_error", f"Charge for {intent_id} has already been refunded.", code="charge_already_refunded")
    amount = int(form.get("amount") or left)
    if intent["currency"] in WHOLE_UNITS and amount % 100:
        return whole_units_refused(intent["currency"]) + (False,)
    if intent["currency"] in THREE_DECIMAL and amount % 10:
        return invalid(f"Invalid amount: amounts in {intent['currency'].upper()} must be divisible by 10",
                       "amount", "invalid_amount") + (False,)
    if amount > left:
        return 400, error_body("invalid_request_error", f"Refund amount ({amount}) is greater than unrefunded amount on charge ({left})", code="amount_too_large")
    refund = {
        "id": "re_" + hashlib.sha256(f"{refund_key}:{time.time_ns()}".encode()).hexdigest()[:24],
        "object": "refund",
        "amount": amount,
        "currency": intent["currency"],
        "payment_intent": intent_id,
        "reason": form.get("reason"),
        "status": "pending" if intent.get("payment_method") == REFUND_FAILS else "succeeded",
        "metadata": metadata_of(form),
        "charge": intent.get("latest_charge"),
        "created": int(time.time()),
    }
    refunds.append(refund)
    STATE["refunds"].setdefault(refund_key, []).append(refund)
    emit("refund.created", refund)
    if refund["status"] == "pending":
        later(fail_refund, refund)
    else:
        charge = STATE["charges_by_id"].get(intent.get("latest_charge"), {})
        charge["amount_refunded"] = charge.get("amount_refunded", 0) + amount
        emit("charge.refunded", charge)
    return 200, json.dumps(refund)


def execute(form, key, version):
    """Runs the payment; returns (status, body) and books the ledger (under LOCK)."""
    refused = check_payment_intent(form, version)
    if refused:
        return refused + (False,)
    pm = form.get("payment_method", "")
    off_session = form.get("off_session") in ("true", "one_off", "recurring")
    intent_id = "pi_" + hashlib.sha256(f"{key}:{time.time_ns()}".encode()).hexdigest()[:24]
    intent = {
        "id": intent_id,
        "object": "payment_intent",
        "amount": int(form.get("amount", "0")),
        "currency": form.get("currency"),
        "customer": form.get("customer"),
        "metadata": metadata_of(form),
        "created": int(time.time()),
        "livemode": False,
        "payment_method": pm or None,
        "statement_descriptor_suffix": form.get("statement_descriptor_suffix"),
    }
    if pm == "pm_card_invalid":
        return 400, error_body("invalid_request_error", "No such PaymentMethod: 'pm_card_invalid'", code="resource_missing")
    if form.get("confirm") != "true":
        # Created, not confirmed (a checkout's first step, as Stripe's): nothing is charged
        # until it is confirmed (POST /v1/payment_intents/PI/confirm).
        intent["status"] = "requires_confirmation" if pm else "requires_payment_method"
        STATE["intents"].setdefault(key, []).append(intent)
        STATE["all_intents"].append(intent)
        emit("payment_intent.created", intent)
        return 200, json.dumps(intent)

    def book(status):
        intent["status"] = status
        STATE["intents"].setdefault(key, []).append(intent)
        STATE["all_intents"].append(intent)
        emit("payment_intent.created", intent)
        if status == "requires_payment_method":
            emit("payment_intent.payment_failed", intent)
        elif status in ("requires_action", "processing"):
            emit("payment_intent." + status, intent)

    if pm in DECLINES:
        code, decline = DECLINES[pm]
        intent["last_payment_error"] = {"type": "card_error", "code": code, "decline_code": decline,
                                        "message": "Your card was declined."}
        book("requires_payment_method")
        STATE["declines"].setdefault(key, []).append({"decline_code": decline, "intent": intent_id})
        return 402, error_body("card_error", "Your card was declined.", code=code, decline_code=decline,
                               intent={"id": intent_id, "object": "payment_intent", "status": "requires_payment_method"})
    if pm in NEEDS_AUTHENTICATION and off_session:
        # Off-session, nobody can authenticate: Stripe fails the confirmation.
        intent["last_payment_error"] = {"type": "card_error", "code": "authentication_required",
                                        "decline_code": "authentication_required",
                                        "message": "Your card was declined. This transaction requires authentication."}
        book("requires_payment_method")
        STATE["declines"].setdefault(key, []).append({"decline_code": "authentication_required", "intent": intent_id})
        return 402, error_body("card_error", "Your card was declined. This transaction requires authentication.",
                               code="authentication_required", decline_code="authentication_required",
                               intent={"id": intent_id, "object": "payment_intent", "status": "requires_payment_method"})
    if pm in NEEDS_AUTHENTICATION:
        book("requires_action")
        STATE["actions"].setdefault(key, []).append(intent)
        return 200, json.dumps(intent)
    if pm in DELAYED:
        book("processing")
        later(settle_delayed, intent, key, DELAYED[pm])
        return 200, json.dumps(intent)
    book("succeeded")
    succeed(intent, key)
    return 200, json.dumps(intent)


def stored(status, body):
    """An answer of endpoints.py for idempotent_post: a refusal saves no result for the key."""
    return (status, json.dumps(body)) + ((False,) if status >= 400 else ())


def create_customer(form, key, version):
    """Creates a customer (under LOCK)."""
    refused = check_metadata(form)
    if refused:
        return refused + (False,)
    cid = "cus_" + hashlib.sha256(f"{key}:{time.time_ns()}".encode()).hexdigest()[:14]
    customer = {"id": cid, "object": "customer", "email": form.get("email"), "description": form.get("description"),
                "metadata": metadata_of(form), "created": int(time.time()), "livemode": False}
    STATE["customers"][cid] = customer
    return 200, json.dumps(customer)


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
        # Stripe names every request, answered or refused, in its Request-Id header
        # (docs.stripe.com/api/request_ids): the id its support and the dashboard's logs know.
        self.send_header("Request-Id", "req_" + "".join(random.choices(REQUEST_ID_CHARS, k=14)))
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
    def stripe_request(self, raw):
        """Records a /v1 request and checks its API version: the version, or None when this
        request was answered (refused) already."""
        url = urlsplit(self.path)
        record({"method": self.command, "path": url.path, "query": url.query, "body": raw,
                "stripe_version": self.headers.get("Stripe-Version"),
                "idempotency_key": self.headers.get("Idempotency-Key"),
                "content_type": self.headers.get("Content-Type")})
        auth = self.headers.get("Authorization") or ""
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        restricted = CONFIG["restricted"].get(token)
        if token != CONFIG["api_key"] and restricted is None:
            self.reply(401, error_body("invalid_request_error", "Invalid API Key provided"))
            return None
        if restricted is not None:
            # A restricted key (rk_...): each resource read, written (which reads too) or none.
            resource = url.path.split("/")[2] if url.path.count("/") >= 2 else ""
            need = "read" if self.command == "GET" else "write"
            if restricted.get(resource) not in ((need, "write") if need == "read" else ("write",)):
                hidden = token[:8] + "*" * max(0, len(token) - 12) + token[-4:]
                self.reply(403, error_body(
                    "invalid_request_error",
                    f"The provided key '{hidden}' does not have the required permissions for this endpoint on account "
                    f"'acct_sim'. Having the 'rak_{resource.rstrip('s')}_{need}' permission would allow this request "
                    "to continue."))
                return None
        version = version_of(self.headers)
        if version is None:
            self.reply(400, error_body("invalid_request_error",
                                       f"Invalid Stripe API version: {self.headers.get('Stripe-Version')}",
                                       code="api_version_invalid"))
            return None
        # The account's rate limit, counted at arrival as Stripe counts it.
        refused = take_rate_token(endpoint_of(self.command, url.path))
        if refused:
            self.reply(429, error_body("invalid_request_error",
                                       "Request rate limit exceeded. Learn more about rate limits here "
                                       "https://stripe.com/docs/rate-limits.", code="rate_limit"),
                       {"Stripe-Rate-Limited-Reason": refused})
            return None
        # The provider's own answer time (the benchmark's realistic latency), seeded.
        with LOCK:
            wait = latency_ms(CONFIG["latency"], CONFIG["latency_rng"])
        if wait:
            time.sleep(wait / 1000)
        return version

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/_sim/health":
            return self.reply(200, '{"ok": true}')
        if url.path.startswith("/v1/") and self.stripe_request("") is None:
            return None
        if url.path == "/v1/payment_intents/search":
            return self.search(dict(parse_qsl(url.query)))
        if url.path == "/v1/payment_intents":
            return self.list_intents(dict(parse_qsl(url.query)))
        if url.path.startswith("/v1/payment_intents/"):
            intent_id = url.path.rsplit("/", 1)[1]
            with LOCK:
                intent = find_intent(intent_id)
            if intent is None:
                return self.reply(404, error_body("invalid_request_error", f"No such payment_intent: '{intent_id}'", code="resource_missing"))
            return self.reply(200, json.dumps(intent))
        if url.path == "/v1/refunds":
            return self.list_refunds(dict(parse_qsl(url.query)))
        if url.path == "/v1/events":
            status, body = events.listing(dict(parse_qsl(url.query)))
            return self.reply(status, json.dumps(body))
        if url.path in ("/v1/charges", "/v1/disputes"):
            # The account's charges or disputes, newest first (limit; payctl preflight reads one).
            q = dict(parse_qsl(url.query))
            try:
                limit = int(q.get("limit", "10"))
            except ValueError:
                limit = 0
            if not 1 <= limit <= 100:
                return self.reply(400, error_body("invalid_request_error", "Limit must be between 1 and 100",
                                                  code="parameter_invalid"))
            with LOCK:
                items = list(STATE["charges_by_id" if url.path == "/v1/charges" else "disputes"].values())[::-1]
                body = json.dumps({"object": "list", "data": items[:limit], "has_more": len(items) > limit,
                                   "url": url.path})
            return self.reply(200, body)
        if url.path == "/v1/webhook_endpoints":
            status, body = events.endpoints(dict(parse_qsl(url.query)))
            return self.reply(status, json.dumps(body))
        if url.path.startswith("/v1/webhook_endpoints/"):
            status, body = endpoints.retrieve(url.path.rsplit("/", 1)[1])
            return self.reply(status, json.dumps(body))
        for prefix, kind, table in (("/v1/refunds/", "refund", None), ("/v1/disputes/", "dispute", "disputes"),
                                    ("/v1/charges/", "charge", "charges_by_id"), ("/v1/events/", "event", None)):
            if url.path.startswith(prefix):
                oid = url.path[len(prefix):]
                with LOCK:
                    if kind == "refund":
                        found = next((r for rs in STATE["refunds"].values() for r in rs if r["id"] == oid), None)
                    elif kind == "event":
                        found = events.find(oid)
                    else:
                        found = STATE[table].get(oid)
                    body = json.dumps(found)
                if found is None:
                    return self.reply(404, error_body("invalid_request_error", f"No such {kind}: '{oid}'", code="resource_missing"))
                return self.reply(200, body)
        if url.path == "/_sim/rate_limit":
            with LOCK:
                return self.reply(200, json.dumps({k: RATE[k] for k in ("per_second", "endpoint_per_second", "allowed",
                                                                        "refused", "refused_by_reason")}))
        if url.path == "/_sim/deliveries":
            return self.reply(200, json.dumps(events.deliveries()))
        if url.path == "/_sim/ledger":
            q = dict(parse_qsl(url.query))
            with LOCK:
                snap = {n: STATE[n] for n in ("charges", "charged_at_ms", "declines", "actions", "calls", "refunds",
                                         "refund_calls")}
                snap["disputes"] = {d["payment_intent"]: d for d in STATE["disputes"].values()}
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
        m = re.fullmatch(r"/v1/webhook_endpoints/(we_[A-Za-z0-9_]+)", url.path)
        if m:
            self.body()
            if self.stripe_request("") is None:
                return None
            status, body = endpoints.delete(m.group(1))
            return self.reply(status, json.dumps(body))
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
                for n in ("keys", "charges", "charged_at_ms", "declines", "calls", "hits", "intents", "refunds", "refund_calls",
                          "intent_refunds", "actions", "customers", "charges_by_id", "disputes"):
                    STATE[n] = {}
                STATE["rules"] = []
                STATE["all_intents"] = []
                RATE.update(per_second=0.0, endpoint_per_second=0.0, buckets={}, allowed=0, refused=0,
                            refused_by_reason={})
                events.reset()
            return self.reply(200, '{"ok": true}')
        if path == "/_sim/events/history":
            body = json.loads(self.body() or "{}")
            try:
                made = events.history(int(body["count"]), int(body["since"]), int(body["until"]),
                                      str(body.get("type", "payment_intent.succeeded")))
            except (KeyError, ValueError, TypeError) as e:
                return self.reply(400, json.dumps({"error": f"count, since and until (unix seconds) are needed: {e}"}))
            return self.reply(200, json.dumps({"made": made}))
        if path == "/_sim/events/undelivered":
            body = json.loads(self.body() or "{}")
            ids = body.get("ids")
            if not isinstance(ids, list):
                return self.reply(400, json.dumps({"error": "ids: a list of event ids"}))
            return self.reply(200, json.dumps({"marked": events.undelivered(ids)}))
        if path == "/_sim/account":
            # The account's default API version ({"api_version": V}): events are rendered in it.
            v = json.loads(self.body() or "{}").get("api_version", "")
            if not API_VERSION.match(v):
                return self.reply(400, json.dumps({"error": "api_version: a Stripe API version"}))
            with LOCK:
                CONFIG["account_version"] = v
            return self.reply(200, json.dumps({"api_version": v}))
        if path == "/_sim/keys":
            # Restricted keys: {"rk_test_...": {"payment_intents": "write", "events": "read", ...}}.
            keys = json.loads(self.body() or "{}")
            if not all(isinstance(v, dict) and set(v.values()) <= {"read", "write"} for v in keys.values()):
                return self.reply(400, json.dumps({"error": "keys: {key: {resource: read|write}}"}))
            with LOCK:
                CONFIG["restricted"].update(keys)
            return self.reply(200, json.dumps({"restricted": sorted(CONFIG["restricted"])}))
        if path == "/_sim/webhook":
            try:
                settings = events.configure(json.loads(self.body() or "{}"))
            except (ValueError, AttributeError) as e:
                return self.reply(400, json.dumps({"error": str(e)}))
            return self.reply(200, json.dumps(settings))
        if path == "/_sim/latency":
            body = json.loads(self.body() or "{}")
            try:
                model = latency_model(float(body.get("p50_ms", 0)), float(body.get("p99_ms", 0)))
            except ValueError as e:
                return self.reply(400, json.dumps({"error": str(e)}))
            with LOCK:
                CONFIG["latency"] = model
            return self.reply(200, json.dumps({"p50_ms": body.get("p50_ms", 0), "p99_ms": body.get("p99_ms", 0)}))
        if path == "/_sim/rate_limit":
            body = json.loads(self.body() or "{}")
            try:
                per_second = float(body.get("per_second", 0))
                endpoint = float(body.get("endpoint_per_second", DEFAULT_ENDPOINT_PER_SECOND))
            except (TypeError, ValueError):
                return self.reply(400, json.dumps({"error": "per_second and endpoint_per_second must be numbers"}))
            if per_second < 0 or endpoint < 0:
                return self.reply(400, json.dumps({"error": "per_second and endpoint_per_second must be 0 or more"}))
            with LOCK:
                RATE.update(per_second=per_second, endpoint_per_second=endpoint if per_second > 0 else 0.0,
                            buckets={}, allowed=0, refused=0, refused_by_reason={})
                limits = {k: RATE[k] for k in ("per_second", "endpoint_per_second")}
            return self.reply(200, json.dumps(limits))
        if path == "/_sim/settle":
            body = json.loads(self.body() or "{}")
            with LOCK:
                CONFIG["settle_s"] = float(body.get("seconds", CONFIG["settle_s"]))
            return self.reply(200, json.dumps({"seconds": CONFIG["settle_s"]}))
        if path == "/_sim/disputes/open":
            # The cardholder disputes a charge made before ({"payment_intent": ID}).
            body = json.loads(self.body() or "{}")
            with LOCK:
                intent = find_intent(str(body.get("payment_intent", "")))
                if intent is None or intent.get("status") != "succeeded":
                    return self.reply(404, error_body("invalid_request_error", "No such charged payment_intent",
                                                      code="resource_missing"))
                open_dispute(intent)
                dispute = STATE["disputes"]["dp_" + intent["id"][3:]]
            return self.reply(200, json.dumps(dispute))
        if path.startswith("/_sim/disputes/") and path.endswith("/close"):
            body = json.loads(self.body() or "{}")
            with LOCK:
                status, answer = close_dispute(path.split("/")[3], bool(body.get("won")))
            return self.reply(status, answer)
        raw = self.body()
        if not path.startswith("/v1/"):
            return self.reply(404, error_body("invalid_request_error", "Unrecognized request URL"))
        version = self.stripe_request(raw)
        if version is None:
            return None
        if path == "/v1/payment_intents":
            return self.idempotent_post(raw, version, "metadata[payment_id]", "calls", execute)
        if path == "/v1/refunds":
            return self.idempotent_post(raw, version, "metadata[refund_id]", "refund_calls", execute_refund)
        m = re.fullmatch(r"/v1/payment_intents/([^/]+)/confirm", path)
        if m:
            return self.idempotent_post(raw, version, None, None,
                                        lambda form, _payment, _version: confirm_intent(m.group(1), form))
        m = re.fullmatch(r"/v1/payment_intents/([^/]+)/cancel", path)
        if m:
            return self.idempotent_post(raw, version, None, None,
                                        lambda form, _payment, _version: cancel_intent(m.group(1), form))
        if path == "/v1/customers":
            return self.idempotent_post(raw, version, None, None, create_customer)
        m = re.fullmatch(r"/v1/webhook_endpoints(?:/(we_[A-Za-z0-9_]+))?", path)
        if m:
            pairs = parse_qsl(raw, keep_blank_values=True)
            answer = (lambda: endpoints.update(m.group(1), pairs)) if m.group(1) else (lambda: endpoints.create(pairs))
            return self.idempotent_post(raw, version, None, None, lambda _form, _key, _version: stored(*answer()))
        return self.reply(404, error_body("invalid_request_error", "Unrecognized request URL"))

    # --- Stripe API --------------------------------------------------------------------------
    def list_intents(self, q):
        """The customer's PaymentIntents, newest first, with Stripe's cursor pagination."""
        try:
            limit = int(q.get("limit", "10"))
            bounds = {op: int(q[f"created[{op}]"]) for op in ("gte", "gt", "lte", "lt") if f"created[{op}]" in q}
        except ValueError:
            return self.reply(*invalid("Invalid integer", "limit", "parameter_invalid_integer"))
        if not 1 <= limit <= 100:
            return self.reply(*invalid("Limit must be between 1 and 100", "limit"))
        tests = {"gte": lambda c, b: c >= b, "gt": lambda c, b: c > b, "lte": lambda c, b: c <= b, "lt": lambda c, b: c < b}
        with LOCK:
            if any(r.get("fault") == "down" and r.get("times") != 0 and r.get("prefix", "") == "" for r in STATE["rules"]):
                return self.reply(503, error_body("api_error", "Service unavailable"))
            data = [i for i in reversed(STATE["all_intents"])
                    if ("customer" not in q or i.get("customer") == q["customer"])
                    and all(tests[op](i["created"], b) for op, b in bounds.items())]
        after = q.get("starting_after")
        if after:
            ids = [i["id"] for i in data]
            if after not in ids:
                return self.reply(400, error_body("invalid_request_error", f"No such payment_intent: '{after}'", code="resource_missing"))
            data = data[ids.index(after) + 1:]
        page = data[:limit]
        return self.reply(200, json.dumps({"object": "list", "data": page, "has_more": len(data) > limit, "url": "/v1/payment_intents"}))

    def search(self, q):
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

    def idempotent_post(self, raw, version, book_field, calls_field, run):
        """Stripe's idempotency around `run(form, book_key, version)`: the books and the fault
        rules are keyed by the form's `book_field` (the Idempotency-Key when absent)."""
        path = urlsplit(self.path).path
        pairs = parse_qsl(raw, keep_blank_values=True)
        form = dict(pairs)
        key = self.headers.get("Idempotency-Key")
        if not key:
            # The processor always sends one; without it a retry could charge twice.
            return self.reply(400, error_body("invalid_request_error", "Idempotency-Key header is required by this simulator"))
        # Stripe compares a key's requests by endpoint and parameters (the version is not one).
        h = params_hash(pairs)
        # The books are kept per payment (metadata[payment_id]), not per key, so that a client
        # that sends another key for the same payment shows up as a double charge (the same for
        # refunds, by metadata[refund_id]).
        payment = (form.get(book_field) if book_field else None) or key
        with LOCK:
            if calls_field:
                STATE[calls_field][payment] = STATE[calls_field].get(payment, 0) + 1
            rule = pick_fault(payment)
            fault = rule.get("fault") if rule else None
            if fault == "down":
                return self.reply(503, error_body("api_error", "Service unavailable"), {"Stripe-Should-Retry": "true"})
            if fault == "429":
                return self.reply(429, error_body("invalid_request_error", "Too many requests", code="rate_limit"), {"Retry-After": "1"})
            if fault == "lock_timeout":
                return self.reply(429, error_body(
                    "invalid_request_error",
                    "This object cannot be accessed right now because another API request or Stripe process is "
                    "currently accessing it. If you see this error intermittently, retry the request.",
                    code="lock_timeout"))
            entry = STATE["keys"].get(key)
            if entry is not None and (time.time() * 1000 - entry["created_ms"]) > retention_ms(payment):
                del STATE["keys"][key]  # forgotten, as Stripe forgets keys after 24 hours
                entry = None
            if entry is not None:
                if entry["path"] != path:
                    return self.reply(400, error_body(
                        "idempotency_error",
                        f"Keys for idempotent requests can only be used for the same endpoint they were first used for "
                        f"('{entry['path']}' vs '{path}'). Try using a key other than '{key}' if you meant to execute a "
                        f"different request."))
                if entry["params"] != h:
                    return self.reply(400, error_body(
                        "idempotency_error",
                        "Keys for idempotent requests can only be used with the same parameters they were first used with."))
                if entry["state"] == "in_flight":
                    return self.reply(409, error_body(
                        "idempotency_error", "There is currently another in-progress request using this Idempotent Key."),
                        {"Stripe-Should-Retry": "true"})
                return self.reply(entry["status"], entry["body"], {"Idempotent-Replayed": "true"})
            STATE["keys"][key] = {"params": h, "path": path, "state": "in_flight", "created_ms": time.time() * 1000}
        if fault == "latency":
            time.sleep(rule.get("latency_ms", 1000) / 1000)
        with LOCK:
            status, body, *executed = run(form, payment, version)
            if executed == [False]:
                # Refused by validation before execution: Stripe saves no result for the key.
                del STATE["keys"][key]
                return self.reply(status, body)
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
    ap.add_argument("--account-api-version", default=CONFIG["account_version"],
                    help="the account's default API version, for requests without Stripe-Version")
    ap.add_argument("--record", help="append every /v1 request to this file, one JSON line each")
    ap.add_argument("--latency", default="0,0", metavar="P50_MS,P99_MS",
                    help="answer every /v1 request after a seeded log-normal time with this median and "
                         "99th percentile (Stripe-like: 350,1500); 0,0 answers at once")
    ap.add_argument("--settle-seconds", type=float, default=2.0,
                    help="how long delayed payments, failing refunds and disputes take to happen")
    ap.add_argument("--webhook-url", help="deliver every event here, signed (see events.py)")
    ap.add_argument("--webhook-secret", action="append", default=[],
                    help="a signing secret of the webhook endpoint (whsec_...); twice while one is rolled")
    args = ap.parse_args()
    if not API_VERSION.match(args.account_api_version):
        ap.error(f"--account-api-version {args.account_api_version!r} is not a Stripe API version")
    CONFIG["account_version"] = args.account_api_version
    CONFIG["record"] = open(args.record, "a", buffering=1) if args.record else None
    CONFIG["api_key"] = args.api_key
    CONFIG["rng"] = random.Random(args.seed)
    CONFIG["key_retention_ms"] = args.key_retention_seconds * 1000
    CONFIG["settle_s"] = args.settle_seconds
    try:
        p50, p99 = (float(x) for x in args.latency.split(","))
        CONFIG["latency"] = latency_model(p50, p99)
    except ValueError as e:
        ap.error(f"--latency {args.latency!r}: {e}")
    CONFIG["latency_rng"] = random.Random(args.seed)
    if args.webhook_url:
        events.configure({"url": args.webhook_url, "secrets": args.webhook_secret})
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
