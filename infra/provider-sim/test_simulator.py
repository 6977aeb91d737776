#!/usr/bin/env python3
"""The simulator behaves like a current Stripe account where the project depends on it, and
refuses what Stripe refuses the way Stripe refuses it (run by make test).

Each case names the Stripe behaviour it stands for; the simulator runs as its own process on a
free port, as the tests use it.
"""

import hashlib
import hmac
import json
import os
import threading
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlencode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import simulator as SIMULATOR  # noqa: E402  (its pure functions; the server runs as a process)
CURRENT = "2026-10-28.endive"
OLD_FORM = {"amount": "1999", "currency": "usd", "customer": "cus_1", "payment_method": "pm_card_visa",
            "confirm": "true"}


class Simulator(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        port_file = os.path.join(cls.dir.name, "port")
        cls.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "simulator.py"), "--port", "0",
                                     "--port-file", port_file, "--settle-seconds", "0.3"], stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while not os.path.exists(port_file):
            if time.time() > deadline:
                raise RuntimeError("the simulator did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            cls.base = f"http://127.0.0.1:{f.read().strip()}"

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait()
        cls.dir.cleanup()

    def call(self, method, path, form=None, key=None, version=CURRENT, query=None):
        url = self.base + path + ("?" + urlencode(query) if query else "")
        data = urlencode(form).encode() if form is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", "Bearer sk_test_local")
        if version:
            req.add_header("Stripe-Version", version)
        if key:
            req.add_header("Idempotency-Key", key)
        if data is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def pay(self, key, version=CURRENT, **fields):
        form = dict(OLD_FORM, off_session="true", **{"metadata[payment_id]": key})
        form.update(fields)
        return self.call("POST", "/v1/payment_intents", {k: v for k, v in form.items() if v is not None}, key, version)

    def test_the_old_form_is_refused_on_a_current_version_with_stripe_s_message_and_saves_no_result(self):
        # Changelog 2023-08-16: a confirmation needs a return_url unless off_session=true.
        status, body = self.call("POST", "/v1/payment_intents", dict(OLD_FORM, **{"metadata[payment_id]": "old-1"}), "old-1")
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        self.assertTrue(body["error"]["message"].startswith("A `return_url` must be specified because this Payment Intent"))
        # A request refused by validation saves no result: the key works with corrected parameters.
        status, body = self.pay("old-1")
        self.assertEqual((status, body["status"]), (200, "succeeded"))
        for fix in ({"return_url": "https://example.com/back"},
                    {"automatic_payment_methods[enabled]": "true", "automatic_payment_methods[allow_redirects]": "never"}):
            status, _ = self.call("POST", "/v1/payment_intents", dict(OLD_FORM, **fix), "fix-" + str(len(fix)))
            self.assertEqual(status, 200, fix)

    def test_every_answer_names_its_request_in_request_id_as_stripe_s_do(self):
        # docs.stripe.com/api/request_ids: each request, answered or refused, has its Request-Id.
        seen = set()
        for path, data in (("/v1/payment_intents", urlencode(dict(OLD_FORM, off_session="true")).encode()),
                           ("/v1/payment_intents", b"amount=1"),
                           ("/v1/refunds", None)):
            req = urllib.request.Request(self.base + path, data=data, method="POST" if data else "GET")
            req.add_header("Authorization", "Bearer sk_test_local")
            req.add_header("Stripe-Version", CURRENT)
            if data:
                req.add_header("Idempotency-Key", f"rid-{len(seen)}-{len(data)}")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    rid = r.headers["Request-Id"]
            except urllib.error.HTTPError as e:
                rid = e.headers["Request-Id"]
            self.assertRegex(rid or "", r"^req_[A-Za-z0-9]{14}$", path)
            seen.add(rid)
        self.assertEqual(len(seen), 3, "one id a request")

    def test_an_older_api_version_keeps_the_old_default(self):
        status, body = self.call("POST", "/v1/payment_intents", dict(OLD_FORM), "v2022", version="2022-11-15")
        self.assertEqual((status, body["status"]), (200, "succeeded"))
        # Without a header, the account's default version (current) decides.
        status, _ = self.call("POST", "/v1/payment_intents", dict(OLD_FORM), "nover", version=None)
        self.assertEqual(status, 400)
        status, body = self.call("GET", "/v1/refunds", version="latest", query={"payment_intent": "pi_x"})
        self.assertEqual((status, body["error"]["code"]), (400, "api_version_invalid"))

    def test_amounts_below_stripe_s_minimum_or_off_the_three_decimal_grid_are_refused(self):
        status, body = self.pay("min-usd", amount="49")
        self.assertEqual((status, body["error"]["code"]), (400, "amount_too_small"))
        self.assertEqual(self.pay("ok-usd", amount="50")[0], 200)
        self.assertEqual(self.pay("ok-jpy", amount="50", currency="jpy")[0], 200)
        self.assertEqual(self.pay("min-jpy", amount="49", currency="jpy")[0], 400)
        self.assertEqual(self.pay("kwd", amount="1005", currency="kwd")[0], 400)
        status, body = self.pay("max", amount="100000000")
        self.assertEqual((status, body["error"]["code"]), (400, "amount_too_large"))
        self.assertEqual(self.pay("max-idr", amount="100000000", currency="idr")[0], 200, "IDR's twelve digits")

    def test_whole_units_currencies_refuse_a_fraction_as_stripe_does(self):
        # Stripe's special cases (ISK since 2023-04-14, UGX): two decimals that are always 00.
        # The simulator took ISK 40.10 before; Stripe refuses it, charge and refund alike.
        for currency in ("isk", "ugx"):
            status, body = self.pay(f"frac-{currency}", amount="4010", currency=currency)
            self.assertEqual((status, body["error"]["code"]), (400, "invalid_charge_amount_no_decimal_compatible"))
            status, body = self.pay(f"whole-{currency}", amount="4000", currency=currency)
            self.assertEqual(status, 200, currency)
            status, refund = self.call("POST", "/v1/refunds", {"payment_intent": body["id"], "amount": "150"},
                                       f"refund:frac-{currency}")
            self.assertEqual((status, refund["error"]["code"]), (400, "invalid_charge_amount_no_decimal_compatible"))
            status, _ = self.call("POST", "/v1/refunds", {"payment_intent": body["id"], "amount": "100"},
                                  f"refund:whole-{currency}")
            self.assertEqual(status, 200, currency)
        # HUF's and TWD's special cases are payouts': a charge takes two decimals.
        self.assertEqual(self.pay("huf", amount="17501", currency="huf")[0], 200)

    def test_metadata_limits_and_an_empty_value_unsets_its_key(self):
        many = {f"metadata[k{i}]": "v" for i in range(50)}
        self.assertEqual(self.pay("meta-51", **many)[0], 400, "50 keys and payment_id")
        self.assertEqual(self.pay("meta-long-key", **{"metadata[" + "k" * 41 + "]": "v"})[0], 400)
        self.assertEqual(self.pay("meta-long-value", **{"metadata[k]": "v" * 501})[0], 400)
        status, body = self.pay("meta-empty", **{"metadata[gone]": "", "metadata[kept]": "café & 1"})
        self.assertEqual(status, 200)
        self.assertNotIn("gone", body["metadata"])
        self.assertEqual(body["metadata"]["kept"], "café & 1")

    def test_a_statement_suffix_must_fit_the_account_s_prefix_and_stripe_s_characters(self):
        status, intent = self.pay("sds-1", statement_descriptor_suffix="ORDER 1234")
        self.assertEqual((status, intent["statement_descriptor_suffix"]), (200, "ORDER 1234"))
        for key, bad in (("sds-2", "ORDER 12345678"), ("sds-3", "1234"), ("sds-4", "A*B")):
            status, body = self.pay(key, statement_descriptor_suffix=bad)
            self.assertEqual((status, body["error"]["param"]), (400, "statement_descriptor_suffix"), bad)

    def test_a_key_is_account_wide_across_endpoints(self):
        status, body = self.pay("shared-key")
        self.assertEqual(status, 200)
        status, err = self.call("POST", "/v1/refunds", {"payment_intent": body["id"], "metadata[refund_id]": "r"}, "shared-key")
        self.assertEqual((status, err["error"]["type"]), (400, "idempotency_error"))
        self.assertIn("same endpoint", err["error"]["message"])
        self.assertEqual(self.call("POST", "/v1/refunds", {"payment_intent": body["id"]}, "refund:shared-key")[0], 200)

    def test_a_three_decimal_refund_must_end_in_zero(self):
        _, intent = self.pay("kwd-refund", amount="10000", currency="kwd")
        status, body = self.call("POST", "/v1/refunds", {"payment_intent": intent["id"], "amount": "1005"}, "refund:kwd-1")
        self.assertEqual((status, body["error"]["code"]), (400, "invalid_amount"))
        status, _ = self.call("POST", "/v1/refunds", {"payment_intent": intent["id"], "amount": "1000"}, "refund:kwd-1")
        self.assertEqual(status, 200, "a refused validation saves no result for the key")

    def test_cards_that_need_the_customer_fail_off_session_and_wait_on_session(self):
        for pm in ("pm_card_authenticationRequired", "pm_card_threeDSecure2Required", "pm_card_threeDSecureRequired"):
            status, body = self.pay("auth-" + pm, payment_method=pm)
            self.assertEqual(status, 402, pm)
            self.assertEqual((body["error"]["type"], body["error"]["code"]), ("card_error", "authentication_required"))
            self.assertTrue(body["error"]["payment_intent"]["id"].startswith("pi_"))
            status, body = self.pay("auth-on-" + pm, payment_method=pm, off_session=None, return_url="https://example.com")
            self.assertEqual((status, body["status"]), (200, "requires_action"), pm)

    def test_declines_carry_stripe_s_codes(self):
        for pm, code, decline in (("pm_card_chargeDeclined", "card_declined", "generic_decline"),
                                  ("pm_card_chargeDeclinedInsufficientFunds", "card_declined", "insufficient_funds"),
                                  ("pm_card_chargeDeclinedLostCard", "card_declined", "lost_card"),
                                  ("pm_card_chargeDeclinedExpiredCard", "expired_card", "expired_card"),
                                  ("pm_card_chargeDeclinedIncorrectCvc", "incorrect_cvc", "incorrect_cvc")):
            status, body = self.pay("decl-" + pm, payment_method=pm)
            self.assertEqual((status, body["error"]["code"], body["error"]["decline_code"]), (402, code, decline))

    def test_a_customer_s_intents_list_newest_first_in_pages(self):
        ids = [self.pay(f"list-{i}", customer="cus_list")[1]["id"] for i in range(3)]
        status, page = self.call("GET", "/v1/payment_intents", query={"customer": "cus_list", "limit": "2"})
        self.assertEqual(status, 200)
        self.assertEqual([i["id"] for i in page["data"]], ids[::-1][:2])
        self.assertTrue(page["has_more"])
        _, rest = self.call("GET", "/v1/payment_intents",
                            query={"customer": "cus_list", "limit": "2", "starting_after": page["data"][-1]["id"]})
        self.assertEqual(([i["id"] for i in rest["data"]], rest["has_more"]), ([ids[0]], False))
        _, later = self.call("GET", "/v1/payment_intents",
                             query={"customer": "cus_list", "created[gte]": str(int(time.time()) + 60)})
        self.assertEqual(later["data"], [])

    # --- what Stripe finishes later, and its events ------------------------------------------
    def events_of(self, object_id, **query):
        _, page = self.call("GET", "/v1/events", query=dict(limit="100", **query))
        return [e for e in page["data"] if e["data"]["object"]["id"] == object_id]

    def wait_for(self, what, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = what()
            if found:
                return found
            time.sleep(0.05)
        self.fail("timed out")

    def test_the_ledger_says_when_each_charge_was_booked(self):
        before = int(time.time() * 1000)
        status, intent = self.pay("booked-at")
        after = int(time.time() * 1000)
        self.assertEqual((status, intent["status"]), (200, "succeeded"))
        ledger = self.call("GET", "/_sim/ledger", query={"key": "booked-at"})[1]
        [at] = ledger["charged_at_ms"]["booked-at"]
        self.assertTrue(before <= at <= after, (before, at, after))
        self.assertEqual(len(ledger["charges"]["booked-at"]), 1)

    def test_an_intent_created_without_confirm_charges_nothing(self):
        # Stripe: a PaymentIntent is created requires_payment_method (or requires_confirmation
        # with a payment method) and charges nothing until it is confirmed. (The simulator once
        # answered it succeeded and booked a charge.)
        status, intent = self.call("POST", "/v1/payment_intents", {"amount": "1000", "currency": "usd"},
                                   "created-only")
        self.assertEqual((status, intent["status"]), (200, "requires_payment_method"))
        status, intent = self.call("POST", "/v1/payment_intents", {"amount": "1000", "currency": "usd",
                                                                   "payment_method": "pm_card_visa"},
                                   "created-with-method")
        self.assertEqual((status, intent["status"]), (200, "requires_confirmation"))
        # Confirmed with no payment method, Stripe refuses it.
        created = self.call("GET", "/v1/payment_intents", query={"limit": "100"})[1]["data"]
        bare = next(i for i in created if i["status"] == "requires_payment_method" and i["payment_method"] is None)
        status, refused = self.call("POST", f"/v1/payment_intents/{bare['id']}/confirm",
                                    {"return_url": "https://example.com/b"}, "confirm-bare")
        self.assertEqual((status, refused["error"]["code"]), (400, "payment_intent_unexpected_state"))
        for key in ("created-only", "created-with-method"):
            ledger = self.call("GET", "/_sim/ledger", query={"key": key})[1]
            self.assertEqual(ledger["charges"], {}, key)
        # Confirmed by the merchant, it charges.
        status, confirmed = self.call("POST", f"/v1/payment_intents/{intent['id']}/confirm",
                                      {"return_url": "https://example.com/back"}, "confirm-created")
        self.assertEqual((status, confirmed["status"]), (200, "succeeded"), confirmed)

    def test_ach_debits_answer_processing_and_settle_later_with_an_event(self):
        status, intent = self.pay("ach-ok", payment_method="pm_usBankAccount_success")
        self.assertEqual((status, intent["status"]), (200, "processing"))
        done = self.wait_for(lambda: [e for e in self.events_of(intent["id"]) if e["type"] == "payment_intent.succeeded"])
        self.assertEqual(done[0]["data"]["object"]["status"], "succeeded")
        self.assertEqual(self.call("GET", f"/v1/payment_intents/{intent['id']}")[1]["status"], "succeeded")
        status, intent = self.pay("ach-closed", payment_method="pm_usBankAccount_accountClosed")
        self.assertEqual(intent["status"], "processing")
        failed = self.wait_for(lambda: [e for e in self.events_of(intent["id"]) if e["type"] == "payment_intent.payment_failed"])
        obj = failed[0]["data"]["object"]
        self.assertEqual((obj["status"], obj["last_payment_error"]["code"]), ("requires_payment_method", "account_closed"))
        kinds = [e["type"] for e in self.events_of(intent["id"])]
        self.assertEqual(kinds[::-1], ["payment_intent.created", "payment_intent.processing", "payment_intent.payment_failed"])

    def test_a_failed_debit_is_not_final_until_its_intent_is_canceled(self):
        # Stripe: a debit that fails leaves its PaymentIntent requires_payment_method, which its
        # customer may confirm again; only a cancel ends it (payment_intent.canceled), and a
        # canceled intent is neither confirmed nor canceled again.
        _, intent = self.pay("ach-again", payment_method="pm_usBankAccount_accountClosed")
        self.wait_for(lambda: [e for e in self.events_of(intent["id"]) if e["type"] == "payment_intent.payment_failed"])
        status, refused = self.call("POST", f"/v1/payment_intents/{intent['id']}/cancel",
                                    {"cancellation_reason": "because"}, "cancel-bad-reason")
        self.assertEqual((status, refused["error"]["type"]), (400, "invalid_request_error"))
        status, canceled = self.call("POST", f"/v1/payment_intents/{intent['id']}/cancel",
                                     {"cancellation_reason": "abandoned"}, "cancel-ach-again")
        self.assertEqual((status, canceled["status"], canceled["cancellation_reason"]), (200, "canceled", "abandoned"))
        kinds = [e["type"] for e in self.events_of(intent["id"])]
        self.assertEqual(kinds[0], "payment_intent.canceled")
        status, refused = self.call("POST", f"/v1/payment_intents/{intent['id']}/confirm",
                                    {"payment_method": "pm_card_visa"}, "confirm-canceled")
        self.assertEqual((status, refused["error"]["code"]), (400, "payment_intent_unexpected_state"))
        status, refused = self.call("POST", f"/v1/payment_intents/{intent['id']}/cancel", {}, "cancel-again")
        self.assertEqual((status, refused["error"]["code"]), (400, "payment_intent_unexpected_state"))
        # A succeeded one is not canceled: it is refunded.
        _, paid = self.pay("card-paid", payment_method="pm_card_visa")
        status, refused = self.call("POST", f"/v1/payment_intents/{paid['id']}/cancel", {}, "cancel-paid")
        self.assertEqual((status, refused["error"]["code"]), (400, "payment_intent_unexpected_state"))

    def test_a_refund_of_a_refund_fail_card_fails_after_pending_and_its_amount_is_refundable_again(self):
        _, intent = self.pay("rf", payment_method="pm_card_refundFail", amount="1000")
        status, refund = self.call("POST", "/v1/refunds", {"payment_intent": intent["id"], "metadata[refund_id]": "rf-1"}, "refund:rf-1")
        self.assertEqual((status, refund["status"]), (200, "pending"))
        self.wait_for(lambda: [e for e in self.events_of(refund["id"]) if e["type"] == "refund.failed"])
        _, now = self.call("GET", f"/v1/refunds/{refund['id']}")
        self.assertEqual((now["status"], now["failure_reason"]), ("failed", "expired_or_canceled_card"))
        status, again = self.call("POST", "/v1/refunds", {"payment_intent": intent["id"], "amount": "1000"}, "refund:rf-2")
        self.assertEqual((status, again["amount"]), (200, 1000), again)

    def test_a_dispute_opens_holds_the_charge_from_refunds_and_closes(self):
        _, intent = self.pay("dp", payment_method="pm_card_createDispute", amount="700")
        created = self.wait_for(lambda: [e for e in self.call("GET", "/v1/events", query={"type": "charge.dispute.*", "limit": "100"})[1]["data"]
                                         if e["data"]["object"]["payment_intent"] == intent["id"]])
        dispute = created[-1]["data"]["object"]
        self.assertEqual((dispute["status"], dispute["amount"]), ("needs_response", 700))
        _, charge = self.call("GET", f"/v1/charges/{dispute['charge']}")
        self.assertEqual(charge["payment_intent"], intent["id"])
        status, err = self.call("POST", "/v1/refunds", {"payment_intent": intent["id"]}, "refund:dp-1")
        self.assertEqual((status, err["error"]["code"]), (400, "charge_disputed"))
        req = urllib.request.Request(f"{self.base}/_sim/disputes/{dispute['id']}/close", data=b'{"won": true}', method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            self.assertEqual(json.loads(r.read())["status"], "won")
        self.assertEqual(self.call("GET", f"/v1/disputes/{dispute['id']}")[1]["status"], "won")

    def test_events_list_newest_first_in_pages_and_by_type(self):
        self.pay("ev-list-1")
        _, page = self.call("GET", "/v1/events", query={"limit": "1", "type": "payment_intent.succeeded"})
        self.assertEqual((len(page["data"]), page["has_more"]), (1, True))
        first = page["data"][0]
        self.assertEqual((first["object"], first["type"]), ("event", "payment_intent.succeeded"))
        _, rest = self.call("GET", "/v1/events", query={"limit": "100", "type": "payment_intent.succeeded",
                                                         "starting_after": first["id"]})
        self.assertNotIn(first["id"], [e["id"] for e in rest["data"]])
        self.assertTrue(all(a["created"] >= b["created"] for a, b in zip(rest["data"], rest["data"][1:])))
        status, err = self.call("GET", "/v1/events", query={"limit": "101"})
        self.assertEqual(status, 400, err)
        _, later = self.call("GET", "/v1/events", query={"created[gt]": str(int(time.time()) + 60)})
        self.assertEqual(later["data"], [])

    def test_events_walk_forward_from_a_cursor_with_ending_before(self):
        # Stripe's way to catch up on undelivered events: ending_before an event id gives the
        # page just newer than it, newest first, has_more while newer ones follow.
        self.pay("ev-fwd-0")
        _, anchor = self.call("GET", "/v1/events", query={"limit": "1"})
        cursor = anchor["data"][0]["id"]
        for i in range(1, 4):
            self.pay(f"ev-fwd-{i}")
        _, page = self.call("GET", "/v1/events", query={"limit": "2", "ending_before": cursor})
        self.assertEqual((len(page["data"]), page["has_more"]), (2, True))
        self.assertGreaterEqual(page["data"][0]["created"], page["data"][1]["created"])
        seen, walked = [], cursor
        while True:
            _, p = self.call("GET", "/v1/events", query={"limit": "2", "ending_before": walked})
            if not p["data"]:
                break
            seen.extend(reversed([e["id"] for e in p["data"]]))
            walked = p["data"][0]["id"]
            if not p["has_more"]:
                break
        _, newest = self.call("GET", "/v1/events", query={"limit": "100"})
        ids = [e["id"] for e in newest["data"]]
        self.assertEqual(seen, list(reversed(ids[:ids.index(cursor)])), "every newer event once, oldest first")
        status, err = self.call("GET", "/v1/events", query={"ending_before": cursor, "starting_after": cursor})
        self.assertEqual(status, 400, err)
        status, err = self.call("GET", "/v1/events", query={"ending_before": "evt_missing"})
        self.assertEqual((status, err["error"].get("code")), (400, "resource_missing"))


class RateLimit(unittest.TestCase):
    """The account's limit as Stripe applies it: past the rate, 429 (code rate_limit) with
    Stripe-Rate-Limited-Reason: global-rate; a lock on one object is a 429 lock_timeout without
    the reason header. (A simulator of its own, started as Simulator's.)"""

    setUpClass = classmethod(Simulator.setUpClass.__func__)
    tearDownClass = classmethod(Simulator.tearDownClass.__func__)

    def raw(self, method, path, form=None, key=None):
        data = urlencode(form).encode() if form is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", "Bearer sk_test_local")
        req.add_header("Stripe-Version", CURRENT)
        if key:
            req.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers), json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), json.loads(e.read())

    def control(self, method, path, body=None):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode() if body is not None else None,
                                     method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def test_requests_past_the_account_rate_are_refused_with_stripe_s_reason(self):
        self.control("POST", "/_sim/rate_limit", {"per_second": 5})
        try:
            answers = [self.raw("GET", "/v1/payment_intents", None) for _ in range(15)]
            refused = [a for a in answers if a[0] == 429]
            # One second's worth at once (5), and what trickles in while the 15 are sent.
            self.assertGreaterEqual(len(refused), 8, [a[0] for a in answers])
            self.assertTrue(all(a[0] == 200 for a in answers[:5]))
            for status, headers, body in refused:
                self.assertEqual(headers.get("Stripe-Rate-Limited-Reason"), "global-rate")
                # Stripe's error types are api_error, card_error, idempotency_error and
                # invalid_request_error (the stripe package's definitions); a rate limit is the
                # last, with the code rate_limit.
                self.assertEqual((body["error"]["type"], body["error"]["code"]), ("invalid_request_error", "rate_limit"))
            counts = self.control("GET", "/_sim/rate_limit")
            self.assertEqual(counts["allowed"] + counts["refused"], 15)
            self.assertEqual(counts["refused"], len(refused))
        finally:
            self.control("POST", "/_sim/rate_limit", {"per_second": 0})
        self.assertEqual(self.raw("GET", "/v1/payment_intents")[0], 200)

    def test_each_endpoint_has_its_own_limit_as_stripe_s_do(self):
        # Stripe: every endpoint 25 a second unless raised; GET /v1/payment_intents/{id} for
        # different ids is one endpoint, POST /v1/payment_intents another.
        self.assertEqual(self.control("POST", "/_sim/rate_limit", {"per_second": 100}),
                         {"per_second": 100, "endpoint_per_second": 25})
        self.control("POST", "/_sim/rate_limit", {"per_second": 100, "endpoint_per_second": 5})
        try:
            answers = [self.raw("GET", f"/v1/payment_intents/pi_missing_{i}") for i in range(15)]
            refused = [a for a in answers if a[0] == 429]
            self.assertGreaterEqual(len(refused), 8, [a[0] for a in answers])
            self.assertTrue(all(a[0] == 404 for a in answers[:5]))
            for status, headers, body in refused:
                self.assertEqual(headers.get("Stripe-Rate-Limited-Reason"), "endpoint-rate")
                self.assertEqual(body["error"]["code"], "rate_limit")
            # Other endpoints are within their own limits and the account's: the list, and the
            # search, which is not a retrieve of an object called "search".
            self.assertEqual(self.raw("GET", "/v1/payment_intents")[0], 200)
            self.assertNotEqual(self.raw("GET", "/v1/payment_intents/search?query=x")[0], 429)
            counts = self.control("GET", "/_sim/rate_limit")
            self.assertEqual(counts["refused_by_reason"], {"endpoint-rate": len(refused)})
            self.assertEqual(counts["allowed"], 17 - len(refused))
        finally:
            self.control("POST", "/_sim/rate_limit", {"per_second": 0})

    def test_an_endpoint_is_a_method_and_a_path_without_its_objects_ids(self):
        endpoint = SIMULATOR.endpoint_of
        self.assertEqual(endpoint("POST", "/v1/payment_intents/pi_3MtwBwLkdIwHu7ix28a3tqPa/confirm"),
                         "POST /v1/payment_intents/{id}/confirm")
        self.assertEqual(endpoint("GET", "/v1/payment_intents/pi_merchant_7"), "GET /v1/payment_intents/{id}")
        self.assertEqual(endpoint("GET", "/v1/payment_intents/search"), "GET /v1/payment_intents/search")
        self.assertEqual(endpoint("POST", "/v1/payment_intents"), "POST /v1/payment_intents")
        self.assertEqual(endpoint("GET", "/v1/checkout/sessions/cs_test_a1B2/line_items"),
                         "GET /v1/checkout/sessions/{id}/line_items")

    def test_a_lock_on_the_object_is_a_429_without_the_rate_reason(self):
        self.control("POST", "/_sim/faults", {"rules": [{"prefix": "lock-1", "fault": "lock_timeout", "times": 1}]})
        form = dict(OLD_FORM, off_session="true", **{"metadata[payment_id]": "lock-1"})
        status, headers, body = self.raw("POST", "/v1/payment_intents", form, "lock-1")
        self.assertEqual((status, body["error"]["code"]), (429, "lock_timeout"))
        self.assertNotIn("Stripe-Rate-Limited-Reason", headers)
        status, _, body = self.raw("POST", "/v1/payment_intents", form, "lock-1")
        self.assertEqual((status, body["status"]), (200, "succeeded"))


class WebhookEndpointsApi(unittest.TestCase):
    """Stripe's endpoint API (`/v1/webhook_endpoints`) with what Stripe refuses: a URL it cannot
    reach, a missing required parameter, `api_version` on an update (not a parameter there). The
    simulator answered none of these POSTs before (404)."""

    setUpClass = classmethod(Simulator.setUpClass.__func__)
    tearDownClass = classmethod(Simulator.tearDownClass.__func__)
    call = Simulator.call

    def form(self, url, *kinds, **extra):
        f = {"url": url, **{f"enabled_events[{i}]": k for i, k in enumerate(kinds)}}
        f.update(extra)
        return f

    def test_a_restricted_key_reads_and_writes_only_what_it_was_given(self):
        req = urllib.request.Request(self.base + "/_sim/keys", method="POST", data=json.dumps(
            {"rk_test_narrow": {"payment_intents": "write", "refunds": "read"}}).encode())
        urllib.request.urlopen(req, timeout=10).read()

        def call(method, path, form=None):
            data = urlencode(form).encode() if form is not None else None
            r = urllib.request.Request(self.base + path, data=data, method=method)
            r.add_header("Authorization", "Bearer rk_test_narrow")
            r.add_header("Idempotency-Key", f"narrow-{time.time_ns()}")
            try:
                with urllib.request.urlopen(r, timeout=10) as a:
                    return a.status, json.loads(a.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        self.assertEqual(call("GET", "/v1/refunds?limit=1")[0], 200)
        self.assertEqual(call("GET", "/v1/payment_intents?limit=1")[0], 200)
        status, body = call("POST", "/v1/refunds", {})
        self.assertEqual(status, 403)
        self.assertIn("rak_refund_write", body["error"]["message"])
        self.assertNotIn("rk_test_narrow", body["error"]["message"])
        self.assertEqual(call("GET", "/v1/events?limit=1")[0], 403)
        self.assertEqual(call("POST", "/v1/payment_intents", {})[0], 400)

    def test_register_update_and_delete_as_stripe_does(self):
        private = self.form("http://127.0.0.1:9/v1/provider-events", "payment_intent.succeeded")
        status, body = self.call("POST", "/v1/webhook_endpoints", private, key="we-1")
        self.assertEqual((status, body["error"]["code"]), (400, "url_invalid"))
        self.assertIn("publicly accessible", body["error"]["message"])
        status, body = self.call("POST", "/v1/webhook_endpoints", {"url": "https://hooks.example/e"}, key="we-2")
        self.assertEqual((status, body["error"]["code"], body["error"]["param"]), (400, "parameter_missing", "enabled_events"))

        form = self.form("https://hooks.example/e", "payment_intent.succeeded", "refund.failed",
                         api_version=CURRENT, **{"metadata[stack]": "s1"})
        status, made = self.call("POST", "/v1/webhook_endpoints", form, key="we-3")
        self.assertEqual(status, 200, made)
        self.assertTrue(made["secret"].startswith("whsec_"))
        self.assertEqual((made["api_version"], made["enabled_events"], made["metadata"], made["status"]),
                         (CURRENT, ["payment_intent.succeeded", "refund.failed"], {"stack": "s1"}, "enabled"))
        status, again = self.call("POST", "/v1/webhook_endpoints", form, key="we-3")
        self.assertEqual((status, again["id"], again["secret"]), (200, made["id"], made["secret"]))
        status, listed = self.call("GET", "/v1/webhook_endpoints", query={"limit": 100})
        ours = [e for e in listed["data"] if e["id"] == made["id"]]
        self.assertEqual(len(ours), 1)
        self.assertNotIn("secret", ours[0])
        self.assertEqual(ours[0]["api_version"], CURRENT)

        where = f"/v1/webhook_endpoints/{made['id']}"
        status, body = self.call("POST", where, {"api_version": "2024-06-20"}, key="we-4")
        self.assertEqual((status, body["error"]["code"], body["error"]["param"]), (400, "parameter_unknown", "api_version"))
        status, changed = self.call("POST", where, {"disabled": "true", "enabled_events[0]": "*"}, key="we-5")
        self.assertEqual((status, changed["status"], changed["enabled_events"]), (200, "disabled", ["*"]))
        self.assertNotIn("secret", changed)
        status, got = self.call("GET", where)
        self.assertEqual((status, got["status"]), (200, "disabled"))
        status, gone = self.call("DELETE", where)
        self.assertEqual((status, gone["deleted"]), (200, True))
        status, body = self.call("GET", where)
        self.assertEqual((status, body["error"]["code"]), (404, "resource_missing"))

    def test_a_private_url_is_taken_when_the_local_runs_allow_it_and_becomes_the_one_sent_to(self):
        def allow(on):
            req = urllib.request.Request(self.base + "/_sim/webhook", data=json.dumps({"allow_private_urls": on}).encode(),
                                         method="POST")
            urllib.request.urlopen(req, timeout=10).read()
        allow(True)
        url = "http://127.0.0.1:9/v1/provider-events"
        try:
            status, made = self.call("POST", "/v1/webhook_endpoints", self.form(url, "*"), key="we-6")
        finally:
            allow(False)
        self.assertEqual(status, 200, made)
        status, listed = self.call("GET", "/v1/webhook_endpoints", query={"limit": 100})
        self.assertEqual((listed["data"][0]["id"], listed["data"][0]["url"]), (made["id"], url))
        # A second one is listed, sent nothing, until the first is deleted: then it is sent to.
        status, second = self.call("POST", "/v1/webhook_endpoints", self.form("https://hooks.example/2", "*"), key="we-7")
        self.call("DELETE", f"/v1/webhook_endpoints/{made['id']}")
        status, listed = self.call("GET", "/v1/webhook_endpoints", query={"limit": 100})
        self.assertEqual(listed["data"][0]["id"], second["id"])
        self.call("DELETE", f"/v1/webhook_endpoints/{second['id']}")


class Latency(unittest.TestCase):
    """The benchmark's provider answers after a log-normal time with the median and 99th
    percentile asked for (Stripe-like: 350 ms and 1.5 s), reproducible from its seed."""

    def test_the_latency_model_has_the_quantiles_asked_for(self):
        sys.path.insert(0, HERE)
        import random

        import simulator
        model = simulator.latency_model(350, 1500)
        rng = random.Random(7)
        draws = sorted(simulator.latency_ms(model, rng) for _ in range(20000))
        p50, p99 = draws[len(draws) // 2], draws[int(len(draws) * 0.99)]
        self.assertAlmostEqual(p50 / 350, 1, delta=0.05)
        self.assertAlmostEqual(p99 / 1500, 1, delta=0.08)
        first, second = random.Random(3), random.Random(3)
        self.assertEqual([simulator.latency_ms(model, first) for _ in range(3)],
                         [simulator.latency_ms(model, second) for _ in range(3)], "seeded")
        self.assertEqual(simulator.latency_ms(simulator.latency_model(0, 0), random.Random(7)), 0.0)
        with self.assertRaises(ValueError):
            simulator.latency_model(500, 100)


class Webhooks(unittest.TestCase):
    """Events are delivered signed, retried while the endpoint fails, at least once."""

    def test_an_event_is_signed_as_stripe_signs_and_retried_until_acknowledged(self):
        received = []

        class Endpoint(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.headers["Stripe-Signature"], body))
                # The first delivery of each event fails: the provider must try again.
                first = sum(1 for _, b in received if json.loads(b)["id"] == json.loads(body)["id"]) == 1
                self.send_response(500 if first else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        with tempfile.TemporaryDirectory() as d:
            port_file = os.path.join(d, "port")
            proc = subprocess.Popen([sys.executable, os.path.join(HERE, "simulator.py"), "--port", "0", "--port-file", port_file,
                                     "--webhook-url", f"http://127.0.0.1:{server.server_address[1]}/v1/provider-events",
                                     "--webhook-secret", "whsec_old", "--webhook-secret", "whsec_new"], stderr=subprocess.DEVNULL)
            try:
                while not os.path.exists(port_file):
                    time.sleep(0.05)
                with open(port_file) as f:
                    base = f"http://127.0.0.1:{f.read().strip()}"
                req = urllib.request.Request(base + "/_sim/webhook", data=b'{"retry_base_ms": 50}', method="POST")
                urllib.request.urlopen(req, timeout=10).read()
                form = urlencode(dict(OLD_FORM, off_session="true", **{"metadata[payment_id]": "wh-1"})).encode()
                req = urllib.request.Request(base + "/v1/payment_intents", data=form, method="POST")
                req.add_header("Authorization", "Bearer sk_test_local")
                req.add_header("Idempotency-Key", "wh-1")
                urllib.request.urlopen(req, timeout=10).read()
                deadline = time.time() + 10
                while time.time() < deadline:
                    with urllib.request.urlopen(base + "/_sim/deliveries", timeout=10) as r:
                        deliveries = json.loads(r.read())
                    if len(deliveries) == 2 and all(d["delivered"] for d in deliveries.values()):
                        break
                    time.sleep(0.05)
                self.assertEqual(sorted(d["statuses"] for d in deliveries.values()), [[500, 200], [500, 200]])
                # Stripe's filter for undelivered events: what was delivered is not listed, and a
                # delivered event still serves as the cursor (the guide's `ending_before`).
                def events(**q):
                    req = urllib.request.Request(base + "/v1/events?" + urlencode(dict(limit="100", **q)))
                    req.add_header("Authorization", "Bearer sk_test_local")
                    try:
                        with urllib.request.urlopen(req, timeout=10) as r:
                            return r.status, json.loads(r.read())
                    except urllib.error.HTTPError as e:
                        return e.code, json.loads(e.read())
                _, undelivered_before = events(delivery_success="false")
                cursor = events()[1]["data"][0]["id"]
                req = urllib.request.Request(base + "/_sim/webhook", data=b'{"paused": true}', method="POST")
                urllib.request.urlopen(req, timeout=10).read()
                form = urlencode(dict(OLD_FORM, off_session="true", **{"metadata[payment_id]": "wh-2"})).encode()
                req = urllib.request.Request(base + "/v1/payment_intents", data=form, method="POST")
                req.add_header("Authorization", "Bearer sk_test_local")
                req.add_header("Idempotency-Key", "wh-2")
                urllib.request.urlopen(req, timeout=10).read()
                _, pending = events(delivery_success="false", ending_before=cursor)
                _, everything = events(ending_before=cursor)
                pending_ids = [e["id"] for e in everything["data"]]
                self.assertEqual(len(pending_ids), 2, everything)
                _, delivered = events(delivery_success="true")
                self.assertEqual(len(delivered["data"]), 2)
                bad_boolean = events(delivery_success="no")[0]
                req = urllib.request.Request(base + "/_sim/webhook", data=b'{"paused": false}', method="POST")
                urllib.request.urlopen(req, timeout=10).read()
                deadline = time.time() + 10
                while time.time() < deadline and len(received) < 8:
                    time.sleep(0.05)
            finally:
                proc.terminate()
                proc.wait()
                server.shutdown()
                server.server_close()
        self.assertEqual(len(received), 8, "the held events are delivered (each failing once) once unpaused")
        self.assertEqual(undelivered_before["data"], [], "delivered events are not listed undelivered")
        self.assertEqual(pending_ids, [e["id"] for e in pending["data"]])
        self.assertEqual(bad_boolean, 400)
        kinds = {json.loads(b)["type"] for _, b in received}
        self.assertEqual(kinds, {"payment_intent.created", "payment_intent.succeeded"})
        for header, body in received:
            items = [p.split("=", 1) for p in header.split(",")]
            t = [v for k, v in items if k == "t"][0]
            v1 = [v for k, v in items if k == "v1"]
            for secret in ("whsec_old", "whsec_new"):
                expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
                self.assertIn(expected, v1)



class EndpointStatusTest(unittest.TestCase):
    """A disabled endpoint, or one not subscribed to a type, is never sent those events: none
    pending, none failed, so `delivery_success=false` does not list them (Stripe filters on
    delivery attempts); `GET /v1/webhook_endpoints` says so."""

    def test_events_the_endpoint_is_not_sent_are_not_listed_undelivered(self):
        sys.path.insert(0, HERE)
        import events
        events.reset()
        saved = dict(events.WEBHOOK)
        try:
            events.configure({"url": "http://127.0.0.1:9/v1/provider-events", "paused": True, "status": "disabled"})
            off = events.emit("payment_intent.succeeded", {"id": "pi_off"}, None)
            events.configure({"status": "enabled", "enabled_events": ["payment_intent.succeeded"]})
            left_out = events.emit("charge.dispute.created", {"id": "dp_1"}, None)
            sent = events.emit("payment_intent.succeeded", {"id": "pi_on"}, None)
            _, undelivered = events.listing({"delivery_success": "false", "limit": "100"})
            _, everything = events.listing({"limit": "100"})
            events.configure({"status": "disabled", "endpoints": [{"id": "we_other", "url": "https://x.example/hook"}]})
            status, listed = events.endpoints({"limit": "100"})
            with self.assertRaises(ValueError):
                events.configure({"status": "paused"})
        finally:
            events.WEBHOOK.clear()
            events.WEBHOOK.update(saved)
            events.reset()
        self.assertEqual([e["id"] for e in undelivered["data"]], [sent["id"]])
        self.assertEqual({e["id"] for e in everything["data"]}, {off["id"], left_out["id"], sent["id"]})
        self.assertEqual(status, 200)
        self.assertEqual([(e["id"], e["status"], e["object"]) for e in listed["data"]],
                         [("we_sim", "disabled", "webhook_endpoint"), ("we_other", "enabled", "webhook_endpoint")])
        self.assertEqual(listed["data"][0]["enabled_events"], ["payment_intent.succeeded"])

if __name__ == "__main__":
    unittest.main(verbosity=1)


class RenderedInItsVersionTest(unittest.TestCase):
    """An event keeps the API version of its day (the account's default then): before
    2019-02-11 a PaymentIntent's statuses had other names (Stripe's changelog)."""

    def test_an_event_of_an_older_version_names_the_older_statuses(self):
        sys.path.insert(0, HERE)
        import events
        intent = {"id": "pi_1", "object": "payment_intent", "status": "requires_payment_method",
                  "next_action": None}
        old = events.rendered(intent, "2019-01-14")
        self.assertEqual((old["status"], "next_action" in old, "next_source_action" in old),
                         ("requires_source", False, True))
        self.assertEqual(events.rendered(dict(intent, status="requires_action"), "2018-11-08")["status"],
                         "requires_source_action")
        self.assertEqual(events.rendered(intent, CURRENT), intent)
        self.assertEqual(intent["status"], "requires_payment_method", "the object itself is unchanged")
        refund = {"id": "re_1", "object": "refund", "status": "pending"}
        self.assertEqual(events.rendered(refund, "2019-01-14"), refund)
