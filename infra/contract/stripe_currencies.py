"""Stripe's amount rules per currency, read from the project's one stored list
(shared/data/stripe-currencies.json, from docs.stripe.com/currencies), which the processors'
tables (shared/src/domain/limits.rs) are held equal to: for the contract check and the provider
simulator alike."""

import json
import os

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                       "stripe-currencies.json")) as _f:
    CURRENCIES = json.load(_f)
MINIMUMS = CURRENCIES["minimums"]
ZERO_DECIMAL = set(CURRENCIES["zero_decimal"])
THREE_DECIMAL = set(CURRENCIES["three_decimal"])
# Charged in whole units, given with two decimals that are always 00 (Stripe's special cases).
WHOLE_UNITS = set(CURRENCIES["whole_units"])


def maximum(currency):
    return CURRENCIES["maximums"].get(currency, CURRENCIES["maximum"])


def least(currency):
    return MINIMUMS.get(currency, 100 if currency in WHOLE_UNITS else 10 if currency in THREE_DECIMAL else 1)


def display(amount, currency):
    if currency in ZERO_DECIMAL:
        return f"{amount} {currency}"
    d = 3 if currency in THREE_DECIMAL else 2
    return f"{amount / 10 ** d:.{d}f} {currency}"
