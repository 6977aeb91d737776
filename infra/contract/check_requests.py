#!/usr/bin/env python3
"""The contract test: every request the processors sent, checked against Stripe's own definitions.

The authority is the official `stripe` Python package (pinned in requirements.txt): for each
endpoint it ships the typed parameters (`stripe/params/`), generated from Stripe's OpenAPI
description, and it pins the current API version (`stripe/_api_version.py`). This checker reads
the requests the provider simulator recorded (`simulator.py --record FILE`, one JSON line each)
and checks, per request:

- the endpoint is one the project uses, and each form or query parameter exists for it, with
  the nesting (`metadata[k]`, `created[gte]`) and the type (integer, boolean, enum value, string,
  map) that Stripe's definition gives; required parameters are present;
- `Stripe-Version` is the version the package pins, and the project's default
  (`DEFAULT_API_VERSION` in shared/src/stripe/client.rs) is that version too;
- the project's rules: every POST has an Idempotency-Key (refunds' begin `refund:`, payments'
  never do); a confirmation is off-session (`confirm=true` with `off_session=true`, which needs
  no `return_url`); amounts within Stripe's per-currency minimum and eight digits (three-decimal
  currencies ending in 0); metadata of at most 50 keys, keys up to 40 characters without `[`
  or `]`, values of 1 to 500 characters (an empty value would unset the key); a description of
  at most 1000 characters;

and over the whole run, that the traffic covered what it must (`--require`): payment creations,
list lookups by customer, refunds and their lists, retries with one key, a zero-decimal
currency, metadata with characters a form encoding must escape.

Usage: check_requests.py RECORDED.jsonl [--rust-source shared/src/stripe/client.rs]
                         [--rust-limits shared/src/domain/limits.rs] [--require ...]
       check_requests.py --self-test   (the checker refuses what it must: today's old form, ...)
"""

import argparse
import json
import re
import sys
import types
import typing
from collections import Counter
from urllib.parse import parse_qsl

import stripe
import stripe.params as P
import typing_extensions
from stripe._api_version import _ApiVersion
from stripe._request_options import RequestOptions

# The endpoints the project calls, and Stripe's parameter definitions of each.
ENDPOINTS = [
    ("POST", re.compile(r"^/v1/payment_intents$"), P.PaymentIntentCreateParams, "payment_intent.create"),
    ("GET", re.compile(r"^/v1/payment_intents$"), P.PaymentIntentListParams, "payment_intent.list"),
    ("GET", re.compile(r"^/v1/payment_intents/search$"), P.PaymentIntentSearchParams, "payment_intent.search"),
    ("GET", re.compile(r"^/v1/payment_intents/pi_[A-Za-z0-9]+$"), P.PaymentIntentRetrieveParams, "payment_intent.retrieve"),
    ("POST", re.compile(r"^/v1/refunds$"), P.RefundCreateParams, "refund.create"),
    ("GET", re.compile(r"^/v1/refunds$"), P.RefundListParams, "refund.list"),
    ("POST", re.compile(r"^/v1/customers$"), P.CustomerCreateParams, "customer.create"),
    # The events inbox: what an event's payload cannot decide is read as it is now; the
    # catch-up lists what the endpoint missed.
    ("GET", re.compile(r"^/v1/refunds/re_[A-Za-z0-9]+$"), P.RefundRetrieveParams, "refund.retrieve"),
    ("GET", re.compile(r"^/v1/disputes/dp_[A-Za-z0-9]+$"), P.DisputeRetrieveParams, "dispute.retrieve"),
    ("GET", re.compile(r"^/v1/charges/ch_[A-Za-z0-9]+$"), P.ChargeRetrieveParams, "charge.retrieve"),
    ("GET", re.compile(r"^/v1/events$"), P.EventListParams, "event.list"),
    # The scheduled catch-up checks that the webhook is sent every type before it trusts
    # `delivery_success=false`.
    ("GET", re.compile(r"^/v1/webhook_endpoints$"), P.WebhookEndpointListParams, "webhook_endpoint.list"),
    # payctl preflight reads one of each resource the key must read.
    ("GET", re.compile(r"^/v1/charges$"), P.ChargeListParams, "charge.list"),
    ("GET", re.compile(r"^/v1/disputes$"), P.DisputeListParams, "dispute.list"),
    # payctl connect registers the stack's endpoint, or brings one it registered before up to
    # date (events, enabled), replaces one whose secret it cannot know, and removes what it
    # replaced.
    ("POST", re.compile(r"^/v1/webhook_endpoints$"), P.WebhookEndpointCreateParams, "webhook_endpoint.create"),
    ("POST", re.compile(r"^/v1/webhook_endpoints/we_[A-Za-z0-9_]+$"), P.WebhookEndpointUpdateParams,
     "webhook_endpoint.update"),
    ("DELETE", re.compile(r"^/v1/webhook_endpoints/we_[A-Za-z0-9_]+$"), P.WebhookEndpointDeleteParams,
     "webhook_endpoint.delete"),
    # payctl events checkpoint --set looks its event up.
    ("GET", re.compile(r"^/v1/events/evt_[A-Za-z0-9_]+$"), P.EventRetrieveParams, "event.retrieve"),
    # The merchant's on-session confirmation of an intent that needed its customer (the
    # timeline plays it: the customer authenticates weeks later).
    ("POST", re.compile(r"^/v1/payment_intents/pi_[A-Za-z0-9]+/confirm$"), P.PaymentIntentConfirmParams,
     "payment_intent.confirm"),
    # The operator's answer to HeldRefundsOverdue (docs/operate.md): a PaymentIntent that will
    # never be paid is canceled, which cancels its held refunds (held_refunds plays it).
    ("POST", re.compile(r"^/v1/payment_intents/pi_[A-Za-z0-9]+/cancel$"), P.PaymentIntentCancelParams,
     "payment_intent.cancel"),
]
OPTIONS = set(RequestOptions.__annotations__)

# Stripe's amount rules per currency: the project's one stored list (stripe_currencies reads it);
# --rust-limits holds the processors' own table (limits.rs) to it.
from stripe_currencies import MINIMUMS, THREE_DECIMAL, WHOLE_UNITS, ZERO_DECIMAL, display, least, maximum

REQUIREMENTS = {
    "payment_intent.create": lambda s: s["endpoint"]["payment_intent.create"] > 0,
    "payment_intent.list": lambda s: s["customer_list"] > 0,
    "refund.create": lambda s: s["endpoint"]["refund.create"] > 0,
    "refund.list": lambda s: s["endpoint"]["refund.list"] > 0,
    "retried_key": lambda s: s["retried_keys"] > 0,
    "zero_decimal": lambda s: s["zero_decimal"] > 0,
    "escaped_metadata": lambda s: s["escaped_metadata"] > 0,
    "customer.create": lambda s: s["endpoint"]["customer.create"] > 0,
    "event.list": lambda s: s["endpoint"]["event.list"] > 0,
    "webhook_endpoint.list": lambda s: s["endpoint"]["webhook_endpoint.list"] > 0,
    "webhook_endpoint.create": lambda s: s["endpoint"]["webhook_endpoint.create"] > 0,
}


def parse_key(key):
    """`metadata[a]` -> ['metadata', 'a']; `a[0][b]` -> ['a', '0', 'b']; None if malformed."""
    m = re.match(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$", key)
    if not m:
        return None
    return [m.group(1)] + re.findall(r"\[([^\[\]]*)\]", m.group(2))


def nest(pairs):
    """Stripe's form encoding into a tree; a path given twice or both as a value and a tree is
    reported."""
    tree, problems = {}, []
    for key, value in pairs:
        path = parse_key(key)
        if path is None:
            problems.append(f"malformed parameter name {key!r}")
            continue
        node = tree
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"{key!r} nests under a plain value")
                break
            node = child
        else:
            if path[-1] in node:
                problems.append(f"parameter {key!r} given twice")
            node[path[-1]] = value
    return tree, problems


def resolve(tp, module):
    g = vars(sys.modules[module])
    if isinstance(tp, str):
        tp = eval(tp, g)  # the package's own annotation strings
    if isinstance(tp, typing.ForwardRef):
        tp = eval(tp.__forward_arg__, g)
    return tp


def check_value(value, tp, where, module, out):
    """Appends to `out` why `value` (a string, or a tree from the encoding) is not a `tp`."""
    tp = resolve(tp, module)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.NotRequired, typing.Required):
        return check_value(value, args[0], where, module, out)
    if origin in (typing.Union, types.UnionType):
        # The package writes an enum as `Literal[...]|str` so that new values do not break old
        # clients; what Stripe documents are the literal values, so only those are accepted.
        # (`Literal['']|str` is not an enum: the empty string unsets a field.)
        if str in args and any(typing.get_origin(a) is typing.Literal and set(typing.get_args(a)) - {""}
                               for a in args):
            args = tuple(a for a in args if a is not str)
        for arm in args:
            trial = []
            check_value(value, arm, where, module, trial)
            if not trial:
                return
        out.append(f"{where}: {value!r} is none of {tp}")
        return
    if origin is typing.Literal:
        if value not in args:
            out.append(f"{where}: {value!r} is not one of {args}")
        return
    if tp is str:
        if not isinstance(value, str):
            out.append(f"{where}: expected a string, got a nested value")
        return
    if tp is int:
        if not (isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value)):
            out.append(f"{where}: expected an integer, got {value!r}")
        return
    if tp is bool:
        if value not in ("true", "false"):
            out.append(f"{where}: expected true or false, got {value!r}")
        return
    if tp is float:
        if not (isinstance(value, str) and re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", value)):
            out.append(f"{where}: expected a number, got {value!r}")
        return
    if origin in (list, typing.List):
        if not isinstance(value, dict) or not all(k.isdigit() for k in value):
            out.append(f"{where}: expected a list (name[0], name[1], ...)")
            return
        for k, v in value.items():
            check_value(v, args[0], f"{where}[{k}]", module, out)
        return
    if origin in (dict, typing.Dict) or (isinstance(origin, type) and origin.__name__ == "UntypedStripeObject"):
        if not isinstance(value, dict):
            out.append(f"{where}: expected a map (name[key]=value)")
            return
        for k, v in value.items():
            check_value(v, args[-1] if args else str, f"{where}[{k}]", module, out)
        return
    if typing_extensions.is_typeddict(tp):
        check_object(value, tp, where, out)
        return
    out.append(f"{where}: this checker does not know the type {tp}")


def check_object(tree, cls, where, out):
    """Checks a tree against a TypedDict of Stripe's parameters."""
    if not isinstance(tree, dict):
        out.append(f"{where}: expected an object (name[field]=value)")
        return
    hints = dict(cls.__annotations__)
    if RequestOptions in getattr(cls, "__orig_bases__", ()) or cls.__bases__[0] is RequestOptions:
        # The request options (api_key, idempotency_key, ...) are headers, not parameters.
        hints = {k: v for k, v in hints.items() if k not in OPTIONS}
    for k, v in tree.items():
        if k not in hints:
            out.append(f"{where}{'.' if where else ''}{k}: not a parameter of {cls.__name__}")
            continue
        check_value(v, hints[k], f"{where}{'.' if where else ''}{k}", cls.__module__, out)
    for k in getattr(cls, "__required_keys__", ()):
        if k in hints and k not in tree:
            out.append(f"{where}{'.' if where else ''}{k}: required by {cls.__name__}, missing")


def project_rules(name, r, form, tree, out, stats):
    """The project's rules on top of the types."""
    key = r.get("idempotency_key")
    if r["method"] == "POST":
        if not key:
            out.append("POST without an Idempotency-Key")
        if (r.get("content_type") or "").split(";")[0] != "application/x-www-form-urlencoded":
            out.append(f"POST with Content-Type {r.get('content_type')!r}, not a form")
    if name == "refund.create" and key and not key.startswith("refund:"):
        out.append(f"refund key {key!r} is not namespaced refund:<refund_id> (Stripe's keys are account-wide)")
    if name == "payment_intent.create" and key and key.startswith("refund:"):
        out.append(f"payment key {key!r} uses the refunds' namespace")
    meta = tree.get("metadata", {}) if isinstance(tree.get("metadata"), dict) else {}
    if name in ("payment_intent.create", "refund.create", "customer.create"):
        if len(meta) > 50:
            out.append(f"metadata has {len(meta)} keys, Stripe allows 50")
        for k, v in meta.items():
            if len(k) > 40:
                out.append(f"metadata key {k!r} is longer than 40 characters")
            if isinstance(v, str) and not 1 <= len(v) <= 500:
                out.append(f"metadata[{k}] is {len(v)} characters: Stripe stores 1 to 500 (an empty value unsets the key)")
        if any(not c.isascii() for v in meta.values() if isinstance(v, str) for c in v) and any(
                ch in v for v in meta.values() if isinstance(v, str) for ch in "&=+%#"):
            stats["escaped_metadata"] += 1
        d = tree.get("description")
        if isinstance(d, str) and len(d) > 1000:
            out.append(f"description is {len(d)} characters, Stripe allows 1000")
    if name == "payment_intent.create":
        if tree.get("confirm") == "true" and tree.get("off_session") != "true":
            out.append("confirm=true without off_session=true: a current account needs a return_url for that, and a queue has no customer to redirect")
        if "payment_id" not in meta:
            out.append("a PaymentIntent without metadata[payment_id]: no lookup could find it")
        cur = tree.get("currency", "")
        try:
            amount = int(tree.get("amount", ""))
        except ValueError:
            amount = None
        if amount is not None:
            if amount < least(cur):
                out.append(f"amount {amount} {cur} is below Stripe's minimum {display(least(cur), cur)}")
            if amount > maximum(cur):
                out.append(f"amount {amount} {cur} is over Stripe's maximum {maximum(cur)}")
            if cur in WHOLE_UNITS and amount % 100:
                out.append(f"amount {amount} of {cur} is not whole units (a multiple of 100)")
            if cur in THREE_DECIMAL and amount % 10:
                out.append(f"amount {amount} of three-decimal {cur} does not end in 0")
        if cur in ZERO_DECIMAL:
            stats["zero_decimal"] += 1
    if name == "refund.create":
        for k in ("refund_id", "payment_id"):
            if k not in meta:
                out.append(f"a refund without metadata[{k}]")
    if name == "payment_intent.list" and "customer" in tree:
        stats["customer_list"] += 1


def check(records, pinned, rust_version):
    violations, stats = [], {"endpoint": Counter(), "customer_list": 0, "zero_decimal": 0, "escaped_metadata": 0,
                             "probes": 0}
    if rust_version is not None and rust_version != pinned:
        violations.append(f"the project's DEFAULT_API_VERSION is {rust_version!r}, the stripe package pins {pinned!r}")
    seen_keys = Counter()
    for i, r in enumerate(records, 1):
        out = []
        match = [(n, cls) for m, rx, cls, n in ENDPOINTS if m == r["method"] and rx.match(r["path"])]
        if not match:
            out.append(f"{r['method']} {r['path']} is not an endpoint the project uses")
            name = None
        else:
            name, cls = match[0]
            stats["endpoint"][name] += 1
            raw = r["body"] if r["method"] == "POST" else r["query"]
            pairs = parse_qsl(raw or "", keep_blank_values=True, strict_parsing=False)
            tree, problems = nest(pairs)
            out.extend(problems)
            if r["method"] == "POST" and not pairs and (r.get("idempotency_key") or "").startswith("preflight:"):
                # payctl preflight's write probe: an empty form, refused by Stripe for its
                # missing parameters once the key is checked, so nothing is made; its endpoint
                # and version are checked, its parameters are meant to be missing.
                stats["probes"] += 1
            else:
                check_object(tree, cls, "", out)
                project_rules(name, r, dict(pairs), tree, out, stats)
            if r["method"] == "POST" and r.get("idempotency_key"):
                seen_keys[(r["path"], r["idempotency_key"])] += 1
        if r.get("stripe_version") != pinned:
            out.append(f"Stripe-Version {r.get('stripe_version')!r}, not the pinned {pinned!r}")
        for o in out:
            violations.append(f"request {i} ({r['method']} {r['path']}): {o}")
    stats["retried_keys"] = sum(1 for n in seen_keys.values() if n > 1)
    return violations, stats


def rust_limits(path):
    """The project's own table of Stripe's limits (shared/src/domain/limits.rs), to compare."""
    text = open(path).read()
    block = lambda name: text[text.index(f"pub const {name}"):].split("];", 1)[0]
    minimums = {c: int(n.replace("_", "")) for c, n in re.findall(r'\("([a-z]{3})", ([0-9_]+)\)', block("MINIMUMS"))}
    return minimums, set(re.findall(r'"([a-z]{3})"', block("ZERO_DECIMAL"))), set(
        re.findall(r'"([a-z]{3})"', block("THREE_DECIMAL")))


def rust_default(path):
    m = re.search(r'pub const DEFAULT_API_VERSION: &str = "([^"]+)";', open(path).read())
    return m.group(1) if m else "(not found)"


def self_test(pinned):
    """The checker refuses what it must: each bad request alone is a violation; a good one is not."""
    def rec(body, method="POST", path="/v1/payment_intents", key="pay-1", version=pinned, query=""):
        return {"method": method, "path": path, "body": body, "query": query, "stripe_version": version,
                "idempotency_key": key, "content_type": "application/x-www-form-urlencoded"}
    good = ("amount=1999&currency=usd&customer=cus_1&payment_method=pm_card_visa&confirm=true&off_session=true"
            "&metadata[payment_id]=pay-1&metadata[note]=caf%C3%A9+%26+cr%C3%A8me")
    bad = {
        "today's old form (no off_session)": rec(good.replace("&off_session=true", "")),
        "an unknown parameter": rec(good + "&offsession=true"),
        "a wrong nesting": rec(good + "&metadata[a][b]=c"),
        "a non-integer amount": rec(good.replace("amount=1999", "amount=19.99")),
        "an enum value Stripe does not have": rec(
            "payment_intent=pi_1&amount=5&reason=because&metadata[refund_id]=r1&metadata[payment_id]=p1",
            path="/v1/refunds", key="refund:r1"),
        "a boolean that is not one": rec(good.replace("confirm=true", "confirm=yes")),
        "an empty metadata value": rec(good + "&metadata[gone]="),
        "an amount below the minimum": rec(good.replace("amount=1999", "amount=30")),
        "no Stripe-Version": rec(good, version=None),
        "another Stripe-Version": rec(good, version="2023-08-16"),
        "a bare refund key": rec("payment_intent=pi_1&amount=5&metadata[refund_id]=r1&metadata[payment_id]=p1",
                                 path="/v1/refunds", key="r1"),
        "a list parameter the endpoint lacks": rec("", method="GET", path="/v1/payment_intents", key=None,
                                                    query="customer=cus_1&created[since]=5"),
        "a missing required parameter": rec(good.replace("currency=usd&", "")),
        "an empty form that is not preflight's probe": rec("", key="pay-empty"),
        "a probe's key on a request with parameters": rec("amount=1999", key="preflight:2"),
    }
    goods = [
        rec(good),
        rec("", method="GET", path="/v1/payment_intents", key=None,
            query="customer=cus_1&limit=100&created%5Bgte%5D=1796000000&starting_after=pi_1"),
        rec("payment_intent=pi_1&amount=5&reason=requested_by_customer&metadata[refund_id]=r1&metadata[payment_id]=p1",
            path="/v1/refunds", key="refund:r1"),
        rec("", key="preflight:1"),
    ]
    failures = []
    for g in goods:
        v, _ = check([g], pinned, None)
        if v:
            failures.append(f"a good request was refused: {v}")
    for what, r in bad.items():
        v, _ = check([r], pinned, None)
        if not v:
            failures.append(f"not refused: {what}")
        else:
            print(f"refused as it must be: {what}: {v[0]}")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    print(f"self-test: {len(bad)} bad requests refused, {len(goods)} good ones accepted")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recorded", nargs="?")
    ap.add_argument("--rust-source", help="shared/src/stripe/client.rs, whose DEFAULT_API_VERSION must be the package's")
    ap.add_argument("--rust-limits", help="shared/src/domain/limits.rs, whose table must be this checker's")
    ap.add_argument("--require", default=",".join(REQUIREMENTS), help="what the traffic must cover")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    pinned = _ApiVersion.CURRENT
    if args.self_test:
        return self_test(pinned)
    if not args.recorded:
        ap.error("give the recorded requests file")
    records = [json.loads(line) for line in open(args.recorded) if line.strip()]
    rust = rust_default(args.rust_source) if args.rust_source else None
    violations, stats = check(records, pinned, rust)
    if args.rust_limits:
        ours = rust_limits(args.rust_limits)
        for what, mine, theirs in zip(("minimums", "zero-decimal currencies", "three-decimal currencies"),
                                      (MINIMUMS, ZERO_DECIMAL, THREE_DECIMAL), ours):
            if mine != theirs:
                violations.append(f"the project's {what} in {args.rust_limits} differ from Stripe's: {theirs} vs {mine}")
    for need in [n for n in args.require.split(",") if n]:
        if not REQUIREMENTS[need](stats):
            violations.append(f"the recorded traffic never covered {need}")
    counts = ", ".join(f"{n} {k}" for k, n in sorted(stats["endpoint"].items()))
    print(f"contract: {len(records)} requests checked against stripe {stripe.VERSION} (API {pinned}): {counts}; "
          f"{stats['customer_list']} customer lists, {stats['retried_keys']} keys sent more than once, "
          f"{stats['zero_decimal']} zero-decimal charges, {stats['escaped_metadata']} with escaped metadata")
    if violations:
        for v in violations[:50]:
            print("  -", v)
        print(f"contract: {len(violations)} violations", file=sys.stderr)
        return 1
    print("contract: every request is one Stripe's definitions accept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
