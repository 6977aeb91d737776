"""The benchmark's peer: the same payment processor written the way Powertools for AWS Lambda
(Python) documents it: BatchProcessor + process_partial_response for the SQS batch, and
@idempotent_function with the DynamoDB persistence layer around the charge, which calls the
same provider with the same Idempotency-Key (the payment_id).

Environment: IDEMPOTENCY_TABLE (a table with a string partition key "pk"), PROVIDER_API_URL,
PAYMENT_API_KEY, PAYMENT_API_TIMEOUT_SECONDS (default 10).
"""

import json
import os
import urllib.error
import urllib.parse
import urllib.request

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

API_URL = os.environ["PROVIDER_API_URL"].rstrip("/")
API_KEY = os.environ["PAYMENT_API_KEY"]
TIMEOUT = float(os.environ.get("PAYMENT_API_TIMEOUT_SECONDS", "10"))
STRIPE_VERSION = os.environ["STRIPE_API_VERSION"]

processor = BatchProcessor(event_type=EventType.SQS)
persistence = DynamoDBPersistenceLayer(table_name=os.environ["IDEMPOTENCY_TABLE"], key_attr="pk")
config = IdempotencyConfig(event_key_jmespath="payment_id", raise_on_no_idempotency_key=True)


@idempotent_function(data_keyword_argument="payment", config=config, persistence_store=persistence)
def charge(payment: dict) -> dict:
    form = {
        "amount": str(payment["amount"]),
        "currency": payment["currency"].lower(),
        "customer": payment["customer_id"],
        "payment_method": payment["payment_method"],
        "confirm": "true",
        # What a current Stripe account needs from a queue processor, as this project sends it.
        "off_session": "true",
        "metadata[payment_id]": payment["payment_id"],
    }
    request = urllib.request.Request(
        f"{API_URL}/v1/payment_intents",
        data=urllib.parse.urlencode(form).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": payment["payment_id"],
                 "Stripe-Version": STRIPE_VERSION},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            intent = json.load(answer)
            return {"status": intent["status"], "provider_payment_id": intent["id"]}
    except urllib.error.HTTPError as e:
        if e.code == 402:  # a decline is an outcome, stored and not retried
            return {"status": "declined"}
        raise


def record_handler(record: SQSRecord) -> dict:
    return charge(payment=json.loads(record.body))


def lambda_handler(event: dict, context) -> dict:
    config.register_lambda_context(context)
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
