"""The simulator's events, as Stripe keeps and sends them.

Every state change the simulator makes is an `event` object (Stripe's shape: id, object,
api_version, created, data.object as the object was then, livemode, pending_webhooks, request,
type), kept for `GET /v1/events` and sent to the webhook endpoint, if one is set, signed as
Stripe signs (`Stripe-Signature: t=<now>,v1=<HMAC-SHA256 of "{t}.{body}"> per secret`, signed
anew for each attempt). Delivery is at least once and in no promised order, as at Stripe: an
endpoint that answers anything but 2xx, or cannot be reached, is retried with backoff until
`max_attempts`; `duplicate_probability` sends an event twice; `max_jitter_ms` delays each
attempt by up to that much, so events overtake one another; `paused` holds every delivery
(an endpoint that is down) until resumed, counting no attempt.

The endpoint is listed by `GET /v1/webhook_endpoints` as Stripe lists one (`we_sim`), with its
`status` and `enabled_events`: a `disabled` endpoint, or one whose `enabled_events` leave a type
out, is never sent the events it does not take (none pending, none failed: Stripe's
`delivery_success=false` does not list them); `endpoints` adds others the account lists and
the simulator sends nothing to (another system's, or one registered elsewhere).

Control (through the simulator's /_sim/webhook): {"url", "secrets": [...], "duplicate_probability",
"max_jitter_ms", "retry_base_ms", "retry_max_ms", "max_attempts", "paused", "status",
"enabled_events", "endpoints", "allow_private_urls"}. An endpoint registered through Stripe's API
(`POST /v1/webhook_endpoints`, endpoints.py) while none is set becomes the one sent to.
"""

import copy
import hashlib
import heapq
import hmac
import json
import random
import threading
import time
import urllib.error
import urllib.request

_LOCK = threading.Condition()
_EVENTS = []  # every event, oldest first
_QUEUE = []  # (due, seq, event id, attempt)
_DELIVERIES = {}  # event id -> {"attempts": n, "delivered": bool, "statuses": [...]}
_SEQ = [0]
_RNG = random.Random(0)
WEBHOOK = {"url": None, "secrets": [], "duplicate_probability": 0.0, "max_jitter_ms": 0, "retry_base_ms": 500,
           "retry_max_ms": 8000, "max_attempts": 12, "paused": False, "status": "enabled",
           "enabled_events": ["*"], "endpoints": [], "allow_private_urls": False,
           # The endpoint sent to, as listed (a registered one's, when registered through the API).
           "id": "we_sim", "api_version": None, "description": None, "metadata": {}, "created": None}
_CREATED = int(time.time())


def _sends(kind):
    """Whether the endpoint is sent an event of `kind` (as Stripe sends: enabled, subscribed)."""
    return bool(WEBHOOK["url"]) and WEBHOOK["status"] == "enabled" and (
        "*" in WEBHOOK["enabled_events"] or kind in WEBHOOK["enabled_events"])


def sign(body, secrets, t=None):
    """The Stripe-Signature header for `body` (bytes) under each secret."""
    t = int(time.time()) if t is None else t
    parts = [f"t={t}"]
    for s in secrets:
        parts.append("v1=" + hmac.new(s.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest())
    return ",".join(parts)


# Stripe's changelog, 2019-02-11: PaymentIntent statuses renamed (`requires_source` is now
# `requires_payment_method`, `requires_source_action` now `requires_action`), and
# `next_source_action` is now `next_action`. An event keeps the version it was made in.
_BEFORE_2019_02_11 = {"requires_payment_method": "requires_source", "requires_action": "requires_source_action"}


def rendered(obj, version):
    """A snapshot of `obj` as API version `version` shows it."""
    snapshot = copy.deepcopy(obj)
    if version and version[:10] < "2019-02-11" and snapshot.get("object") == "payment_intent":
        snapshot["status"] = _BEFORE_2019_02_11.get(snapshot.get("status"), snapshot.get("status"))
        if "next_action" in snapshot:
            snapshot["next_source_action"] = snapshot.pop("next_action")
    return snapshot


def emit(kind, obj, version, idempotency_key=None):
    """Records an event of `kind` about `obj` (a snapshot, rendered in the account's version
    `version`, as Stripe keeps an event in the version of its day) and queues its delivery."""
    created = int(time.time())
    event = {
        "id": "evt_" + hashlib.sha256(f"{kind}:{obj.get('id')}:{time.time_ns()}:{_RNG.random()}".encode()).hexdigest()[:24],
        "object": "event",
        "api_version": version,
        "created": created,
        "data": {"object": rendered(obj, version)},
        "livemode": False,
        "pending_webhooks": 1 if _sends(kind) else 0,
        "request": {"id": None, "idempotency_key": idempotency_key},
        "type": kind,
    }
    with _LOCK:
        _EVENTS.append(event)
        if _sends(kind):
            copies = 2 if _RNG.random() < WEBHOOK["duplicate_probability"] else 1
            for _ in range(copies):
                _push(event["id"], 1, _jitter())
        _LOCK.notify_all()
    return event


def _jitter():
    return _RNG.random() * WEBHOOK["max_jitter_ms"] / 1000


def _push(event_id, attempt, delay_s):
    _SEQ[0] += 1
    heapq.heappush(_QUEUE, (time.time() + delay_s, _SEQ[0], event_id, attempt))


def configure(settings):
    with _LOCK:
        for k, v in settings.items():
            if k not in WEBHOOK:
                raise ValueError(f"unknown webhook setting {k!r}")
            if k == "status" and v not in ("enabled", "disabled"):
                raise ValueError("status: enabled or disabled")
            if k in ("enabled_events", "endpoints") and not isinstance(v, list):
                raise ValueError(f"{k}: a list")
            WEBHOOK[k] = v
        _LOCK.notify_all()
        return dict(WEBHOOK, secrets=len(WEBHOOK["secrets"]))


def history(count, since, until, kind):
    """The account's other traffic (POST /_sim/events/history): `count` events of `kind` about
    PaymentIntents this system did not create, made evenly over [since, until] (unix seconds)
    and delivered to every endpoint (none pending), placed in the list by their time as
    Stripe lists by creation."""
    made = []
    for i in range(count):
        created = since + (until - since) * i // max(count, 1)
        made.append({
            "id": "evt_h" + hashlib.sha256(f"history:{created}:{i}:{_RNG.random()}".encode()).hexdigest()[:22],
            "object": "event", "api_version": None, "created": created,
            "data": {"object": {"id": f"pi_h{i}", "object": "payment_intent", "status": "succeeded",
                                "amount": 1000, "currency": "usd", "metadata": {}}},
            "livemode": False, "pending_webhooks": 0, "request": {"id": None, "idempotency_key": None},
            "type": kind,
        })
    with _LOCK:
        merged = sorted(_EVENTS + made, key=lambda e: e["created"])  # stable: same-second order kept
        _EVENTS[:] = merged
    return len(made)


def undelivered(ids):
    """POST /_sim/events/undelivered: these events failed every delivery attempt (an outage
    longer than the provider retries): still pending at the endpoint, never sent again."""
    with _LOCK:
        found = [e for e in _EVENTS if e["id"] in set(ids)]
        for e in found:
            e["pending_webhooks"] = 1
        _QUEUE[:] = [q for q in _QUEUE if q[2] not in set(ids)]
        heapq.heapify(_QUEUE)
    return len(found)


def reset():
    with _LOCK:
        _EVENTS.clear()
        _QUEUE.clear()
        _DELIVERIES.clear()


def deliveries():
    with _LOCK:
        return copy.deepcopy(_DELIVERIES)


def listing(q):
    """`GET /v1/events`: newest first, filtered by created[...], type / types[] and
    delivery_success (false: the events still pending or that failed every attempt at the
    webhook endpoint, Stripe's `pending_webhooks` > 0; true: those delivered; an event made
    while no endpoint was set has none pending); Stripe's cursor pagination (`starting_after`: older; `ending_before`: the page just newer than the
    cursor, still newest first, as Stripe's undelivered-events guide walks it). Returns
    (status, body)."""
    try:
        limit = int(q.get("limit", "10"))
        bounds = {op: int(q[f"created[{op}]"]) for op in ("gte", "gt", "lte", "lt") if f"created[{op}]" in q}
    except ValueError:
        return 400, {"error": {"type": "invalid_request_error", "message": "Invalid integer", "code": "parameter_invalid_integer"}}
    if not 1 <= limit <= 100:
        return 400, {"error": {"type": "invalid_request_error", "message": "Limit must be between 1 and 100",
                               "param": "limit", "code": "parameter_invalid"}}
    delivered = q.get("delivery_success")
    if delivered is not None and delivered not in ("true", "false"):
        return 400, {"error": {"type": "invalid_request_error", "message": "Invalid boolean: " + delivered,
                               "param": "delivery_success", "code": "parameter_invalid_boolean"}}
    types = [v for k, v in q.items() if k.startswith("types[")]
    if "type" in q and types:
        return 400, {"error": {"type": "invalid_request_error", "message": "You may only specify one of these parameters: type, types."}}
    tests = {"gte": lambda c, b: c >= b, "gt": lambda c, b: c > b, "lte": lambda c, b: c <= b, "lt": lambda c, b: c < b}

    def wanted(kind):
        if "type" in q:
            pattern = q["type"]
            return kind == pattern or (pattern.endswith(".*") and kind.startswith(pattern[:-1]))
        return not types or kind in types

    def listed(e):
        if delivered is not None and (e["pending_webhooks"] == 0) != (delivered == "true"):
            return False
        return wanted(e["type"]) and all(tests[op](e["created"], b) for op, b in bounds.items())

    after, before = q.get("starting_after"), q.get("ending_before")
    if after and before:
        return 400, {"error": {"type": "invalid_request_error",
                               "message": "You may only specify one of these parameters: ending_before, starting_after."}}
    if before:
        # The page of events created just after the cursor (the cursor need not match the
        # filters: it is a place in the list), newest first; has_more when newer ones follow.
        with _LOCK:
            ids = [e["id"] for e in _EVENTS]
            if before not in ids:
                return 400, {"error": {"type": "invalid_request_error", "message": f"No such event: '{before}'",
                                       "code": "resource_missing"}}
            newer = [e for e in _EVENTS[ids.index(before) + 1:] if listed(e)]
        page = list(reversed(newer[:limit]))
        return 200, {"object": "list", "data": page, "has_more": len(newer) > limit, "url": "/v1/events"}
    with _LOCK:
        data = [e for e in reversed(_EVENTS) if listed(e)]
    if after:
        ids = [e["id"] for e in data]
        if after not in ids:
            return 400, {"error": {"type": "invalid_request_error", "message": f"No such event: '{after}'", "code": "resource_missing"}}
        data = data[ids.index(after) + 1:]
    page = data[:limit]
    return 200, {"object": "list", "data": page, "has_more": len(data) > limit, "url": "/v1/events"}


def endpoints(q):
    """`GET /v1/webhook_endpoints`: the endpoint the simulator sends to (when one is set), then
    the others the account lists, as Stripe's `webhook_endpoint` objects; `limit` (1-100) and
    `starting_after`. Returns (status, body)."""
    try:
        limit = int(q.get("limit", "10"))
    except ValueError:
        return 400, {"error": {"type": "invalid_request_error", "message": "Invalid integer", "code": "parameter_invalid_integer"}}
    if not 1 <= limit <= 100:
        return 400, {"error": {"type": "invalid_request_error", "message": "Limit must be between 1 and 100",
                               "param": "limit", "code": "parameter_invalid"}}
    with _LOCK:
        listed = []
        if WEBHOOK["url"]:
            listed.append({k: WEBHOOK[k] for k in ("id", "url", "status", "api_version", "description", "metadata")}
                          | {"enabled_events": list(WEBHOOK["enabled_events"]), "created": WEBHOOK["created"] or _CREATED})
        listed += [{k: v for k, v in e.items() if k != "secret"} for e in WEBHOOK["endpoints"]]
    data = [dict({"object": "webhook_endpoint", "api_version": None, "application": None, "created": _CREATED,
                  "description": None, "livemode": False, "metadata": {}, "status": "enabled",
                  "enabled_events": ["*"]}, **e) for e in listed]
    after = q.get("starting_after")
    if after:
        ids = [e["id"] for e in data]
        if after not in ids:
            return 400, {"error": {"type": "invalid_request_error", "message": f"No such webhook endpoint: '{after}'",
                                   "code": "resource_missing"}}
        data = data[ids.index(after) + 1:]
    return 200, {"object": "list", "data": data[:limit], "has_more": len(data) > limit, "url": "/v1/webhook_endpoints"}


def find(event_id):
    with _LOCK:
        for e in _EVENTS:
            if e["id"] == event_id:
                return e
    return None


def _deliver(event, attempt):
    url, secrets = WEBHOOK["url"], list(WEBHOOK["secrets"])
    body = json.dumps(event, indent=2).encode()
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/json; charset=utf-8")
    req.add_header("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
    req.add_header("Stripe-Signature", sign(body, secrets))
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return 0


def _run():
    while True:
        with _LOCK:
            while not _QUEUE or WEBHOOK["paused"] or not WEBHOOK["url"] or _QUEUE[0][0] > time.time():
                wait = None if not _QUEUE or WEBHOOK["paused"] or not WEBHOOK["url"] else max(0.0, _QUEUE[0][0] - time.time())
                _LOCK.wait(wait)
            _, _, event_id, attempt = heapq.heappop(_QUEUE)
            event = next((e for e in _EVENTS if e["id"] == event_id), None)
        if event is None:
            continue
        threading.Thread(target=_attempt, args=(event, attempt), daemon=True).start()


def _attempt(event, attempt):
    status = _deliver(event, attempt)
    with _LOCK:
        d = _DELIVERIES.setdefault(event["id"], {"attempts": 0, "delivered": False, "statuses": []})
        d["attempts"] += 1
        d["statuses"].append(status)
        if 200 <= status < 300:
            d["delivered"] = True
            event["pending_webhooks"] = 0
        elif attempt < WEBHOOK["max_attempts"]:
            backoff = min(WEBHOOK["retry_max_ms"], WEBHOOK["retry_base_ms"] * 2 ** (attempt - 1)) / 1000
            _push(event["id"], attempt + 1, backoff + _jitter())
        _LOCK.notify_all()


threading.Thread(target=_run, daemon=True).start()
