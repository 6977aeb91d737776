"""The simulator's webhook endpoints API, as Stripe defines it (`/v1/webhook_endpoints`).

`POST /v1/webhook_endpoints` registers an endpoint (`url` and `enabled_events` required;
`api_version`, `description`, `metadata`, `connect`), answers the `webhook_endpoint` object
with its signing `secret` (the only answer that carries it, as at Stripe); `GET .../{id}`
retrieves one, `POST .../{id}` updates it (`url`, `enabled_events`, `disabled`, `description`,
`metadata`: `api_version` is not a parameter there, and is refused as Stripe refuses any
unknown one), `DELETE .../{id}` deletes it. At most 16 endpoints, as Stripe allows.

Stripe refuses a URL it cannot reach from the internet ("URL must be publicly accessible"); so
does the simulator, unless told otherwise (`POST /_sim/webhook {"allow_private_urls": true}`):
the one departure the local runs need, whose stacks answer on 127.0.0.1.

The first endpoint registered while the simulator sends nowhere becomes the one it sends to
(`events.WEBHOOK`), signed with that endpoint's secret; others are listed and sent nothing until
the one sent to is deleted: then the oldest registered one takes its place.
"""

import hashlib
import ipaddress
import re
import time
from urllib.parse import urlsplit

import events

CREATE = {"api_version", "connect", "description", "enabled_events", "expand", "metadata", "url"}
UPDATE = {"description", "disabled", "enabled_events", "expand", "metadata", "url"}
MAX_ENDPOINTS = 16
API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(\.[a-z]+)?$")
EVENT_TYPE = re.compile(r"^\*$|^[a-z_]+(\.[a-z_]+)+$")


def _error(status, message, param=None, code=None):
    err = {"type": "invalid_request_error", "message": message}
    if code:
        err["code"] = code
    if param:
        err["param"] = param
    return status, {"error": err}


def _private(host):
    host = (host or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_unspecified


def _fields(pairs, allowed):
    """The form's fields (`enabled_events` a list, `metadata` a map), or an error answer."""
    out = {}
    for k, v in pairs:
        name = k.split("[", 1)[0]
        if name not in allowed:
            return None, _error(400, f"Received unknown parameter: {name}", name, "parameter_unknown")
        if name == "enabled_events":
            if not re.fullmatch(r"enabled_events\[\d*\]", k):
                return None, _error(400, f"Invalid array: {k}", name, "parameter_invalid")
            out.setdefault("enabled_events", []).append(v)
        elif name == "metadata":
            m = re.fullmatch(r"metadata\[([^\[\]]+)\]", k)
            if not m:
                return None, _error(400, f"Invalid hash: {k}", name, "parameter_invalid")
            out.setdefault("metadata", {})[m.group(1)] = v
        else:
            out[name] = v
    for i, kind in enumerate(out.get("enabled_events", [])):
        if not EVENT_TYPE.match(kind):
            return None, _error(400, f"Invalid enabled_events[{i}]: must be one of the event types", f"enabled_events[{i}]",
                                "parameter_invalid")
    if "url" in out:
        parts = urlsplit(out["url"])
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None, _error(400, "Invalid URL: URL must be valid", "url", "url_invalid")
        if _private(parts.hostname) and not events.WEBHOOK.get("allow_private_urls"):
            return None, _error(400, "Invalid URL: URL must be publicly accessible. Consider using a tool like "
                                     "Stripe CLI to test webhooks locally: github.com/stripe/stripe-cli", "url", "url_invalid")
    if "api_version" in out and not API_VERSION.match(out["api_version"]):
        return None, _error(400, f"Invalid api_version: {out['api_version']}", "api_version", "parameter_invalid")
    if "disabled" in out and out["disabled"] not in ("true", "false"):
        return None, _error(400, "Invalid boolean: disabled", "disabled", "parameter_invalid")
    return out, None


def _shown(e):
    """The endpoint as Stripe answers it (no secret but at creation)."""
    return {"id": e["id"], "object": "webhook_endpoint", "api_version": e.get("api_version"), "application": None,
            "created": e.get("created"), "description": e.get("description"), "enabled_events": list(e["enabled_events"]),
            "livemode": False, "metadata": dict(e.get("metadata") or {}), "status": e.get("status", "enabled"),
            "url": e["url"]}


def _all():
    """The registered endpoints, the one sent to first (under events._LOCK)."""
    w = events.WEBHOOK
    sent = [w] if w["url"] else []
    return sent + w["endpoints"]


def create(pairs):
    """`POST /v1/webhook_endpoints`: (status, body)."""
    fields, err = _fields(pairs, CREATE)
    if err:
        return err
    for required in ("url", "enabled_events"):
        if not fields.get(required):
            return _error(400, f"Missing required param: {required}.", required, "parameter_missing")
    with events._LOCK:
        if len(_all()) >= MAX_ENDPOINTS:
            return _error(400, f"You have reached the maximum of {MAX_ENDPOINTS} test webhook endpoints.")
        seed = f"{fields['url']}:{time.time_ns()}".encode()
        endpoint = {"id": "we_" + hashlib.sha256(seed).hexdigest()[:24],
                    "secret": "whsec_" + hashlib.sha256(b"secret:" + seed).hexdigest()[:32],
                    "url": fields["url"], "enabled_events": fields["enabled_events"], "status": "enabled",
                    "api_version": fields.get("api_version"), "description": fields.get("description"),
                    "metadata": {k: v for k, v in fields.get("metadata", {}).items() if v != ""},
                    "created": int(time.time())}
        w = events.WEBHOOK
        if not w["url"]:
            w.update({k: v for k, v in endpoint.items() if k != "secret"}, secrets=[endpoint["secret"]])
            events._LOCK.notify_all()
        else:
            w["endpoints"].append(endpoint)
    return 200, dict(_shown(endpoint), secret=endpoint["secret"])


def _find(endpoint_id):
    return next((e for e in _all() if e.get("id", "we_sim") == endpoint_id), None)


def _missing(endpoint_id):
    return _error(404, f"No such webhook endpoint: '{endpoint_id}'", "id", "resource_missing")


def retrieve(endpoint_id):
    with events._LOCK:
        e = _find(endpoint_id)
        return (200, _shown(e)) if e else _missing(endpoint_id)


def update(endpoint_id, pairs):
    """`POST /v1/webhook_endpoints/{id}`: (status, body)."""
    fields, err = _fields(pairs, UPDATE)
    if err:
        return err
    with events._LOCK:
        e = _find(endpoint_id)
        if e is None:
            return _missing(endpoint_id)
        for k in ("url", "enabled_events", "description"):
            if k in fields:
                e[k] = fields[k]
        if "disabled" in fields:
            e["status"] = "disabled" if fields["disabled"] == "true" else "enabled"
        for k, v in fields.get("metadata", {}).items():
            e.setdefault("metadata", {})
            if v == "":
                e["metadata"].pop(k, None)
            else:
                e["metadata"][k] = v
        events._LOCK.notify_all()
        return 200, _shown(e)


def delete(endpoint_id):
    """`DELETE /v1/webhook_endpoints/{id}`: (status, body)."""
    with events._LOCK:
        e = _find(endpoint_id)
        if e is None:
            return _missing(endpoint_id)
        w = events.WEBHOOK
        if e is w:
            w.update(url=None, secrets=[], id="we_sim", api_version=None, description=None, metadata={})
            # The next registered endpoint becomes the one sent to (with its own secret).
            promoted = next((x for x in w["endpoints"] if "secret" in x), None)
            if promoted is not None:
                w["endpoints"].remove(promoted)
                w.update({k: v for k, v in promoted.items() if k != "secret"}, secrets=[promoted["secret"]])
                events._LOCK.notify_all()
        else:
            w["endpoints"].remove(e)
    return 200, {"id": endpoint_id, "object": "webhook_endpoint", "deleted": True}
