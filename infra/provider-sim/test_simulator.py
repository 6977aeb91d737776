#!/usr/bin/env python3
"""The simulator behaves like a current Stripe account where the project depends on it, and
refuses what Stripe refuses the way Stripe refuses it (run by make test).

Each case names the Stripe behaviour it stands for; the simulator runs as its own process on a
free port, as the tests use it.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from urllib.parse import urlencode

HERE = os.path.dirname(os.path.abspath(__file__))
CURRENT = "2026-10-28.endive"
OLD_FORM = {"amount": "1999", "currency": "usd", "customer": "cus_1", "payment_method": "pm_card_visa",
            "confirm": "true"}


class Simulator(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        port_file = os.path.join(cls.dir.name, "port")
        cls.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "simulator.py"), "--port", "0",
                                     "--port-file", port_file], stderr=subprocess.DEVNULL)
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

    def test_metadata_limits_and_an_empty_value_unsets_its_key(self):
        many = {f"metadata[k{i}]": "v" for i in range(50)}
        self.assertEqual(self.pay("meta-51", **many)[0], 400, "50 keys and payment_id")
        self.assertEqual(self.pay("meta-long-key", **{"metadata[" + "k" * 41 + "]": "v"})[0], 400)
        self.assertEqual(self.pay("meta-long-value", **{"metadata[k]": "v" * 501})[0], 400)
        status, body = self.pay("meta-empty", **{"metadata[gone]": "", "metadata[kept]": "café & 1"})
        self.assertEqual(status, 200)
        self.assertNotIn("gone", body["metadata"])
        self.assertEqual(body["metadata"]["kept"], "café & 1")

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


if __name__ == "__main__":
    unittest.main(verbosity=1)
