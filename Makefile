.PHONY: demo test test-fast test-localstack chaos sim sim-capacity timeline check-template package e2e-sam bench lint fmt build install

CHAOS_PAYMENTS ?= 5000
CHAOS_SEED ?= 1
CHAOS_AWS_FAULTS ?= 0.1

## The local end-to-end run: installs what it needs, starts ministack (or uses AWS_ENDPOINT_URL) and the provider simulator.
## Payments go through the payments API; ARGS=--direct sends raw messages into the queue.
ARGS ?=
demo:
	bash infra/scripts/demo.sh $(ARGS)

## The whole test suite, with its own emulator and simulator; prints where its time went.
test:
	bash infra/scripts/test.sh

## A contributor's loop: the build, then the unit, protocol, integration and doc tests against
## their own emulator and simulator; no template checks, packages or deploys (make test is the
## whole suite). TESTS=... filters them as cargo test does (TESTS=events:: say).
TESTS ?=
test-fast:
	bash infra/scripts/test.sh --fast $(TESTS)

## The LocalStack tier: LocalStack's runtime in host mode (no Docker, no account, Python 3.13,
## pinned in infra/requirements-localstack.txt) serves SQS and CloudFormation: the conformance
## check, the processors' tests with SQS on LocalStack and DynamoDB on ministack, the template's
## queues through its CloudFormation. CI runs it after make test.
test-localstack:
	bash infra/scripts/test-localstack.sh

## The chaos checker: processes crashing at random failpoints against a faulty provider, their
## AWS calls throttled, refused, stalled and answers lost (CHAOS_AWS_FAULTS of the calls).
chaos:
	bash infra/scripts/chaos.sh --payments $(CHAOS_PAYMENTS) --seed $(CHAOS_SEED) --aws-faults $(CHAOS_AWS_FAULTS)

## The whole system on a simulated clock (infra/sim): SEEDS seeds from FIRST_SEED, each DAYS simulated
## days of PAYMENTS payments through the real processor against models of SQS, DynamoDB, Lambda's
## event source and the provider, faults injected (CRASH_RATE, AWS_FAULT_RATE, PROVIDER_FAULT_RATE),
## every invariant checked; a line per seed; a failing seed prints the command that replays it
## (TRACE=FILE writes its whole trace). MUTATION=NAME puts a known bug back (the simulator's
## teeth), FIFO=true, PROVIDER_OUTAGE_DAY=D (30 hours), DYNAMODB_OUTAGE_DAY=D and SQS_OUTAGE_DAY=D
## (3 hours), WEBHOOK_OUTAGE_DAY=D (96 hours; _HOURS=H for others), VISIBILITY_TIMEOUT=S,
## MAX_RECEIVE_COUNT=N, PARAMETERS='Name=Value ...' (the template's), DISPUTE_SHARE (0.01 of
## charges) and DISPUTE_DAYS (opened FROM,TO days after the charge: 1,20 here, so that a month's
## run sees disputes open, close and be appealed; a cardholder's window at Stripe is 30,120).
## API_SHARE (0.5 here) is the share of payments sent through the payments API and its outbox relay.
## SHOPPER_TEXT_SHARE (0.05) is the share carrying shoppers' text (any Unicode; a fifth of its pieces
## what no door may take: U+FFFE/U+FFFF, a control character, a card number).
## FORGED_EVENT_SHARE (0.02) is the share of the provider's events an insider forges onto the
## events queue (a final state the provider never reached, under a new id).
## SWEEP (true here) makes each seed draw its own configuration from its seed where none is given
## (infra/sim/src/world/sweep.rs: the refund window, refunds sent again when their record
## expires, the crash rate, the provider's faults); its line says what it drew, and its replay
## command draws the same. SWEEP=false runs every seed as configured.
## Seeds run one per thread on every core (SIM_THREADS=N sets how many); the last line says seeds
## per core-minute, payments simulated per core-second and simulated seconds per real second.
## make test runs a few small seeds, and the scaling test (what the models visit per request at N
## and 4N payments).
SEEDS ?= 20
FIRST_SEED ?= 1
DAYS ?= 30
PAYMENTS ?= 10000
DISPUTE_SHARE ?= 0.01
DISPUTE_DAYS ?= 1,20
API_SHARE ?= 0.5
SWEEP ?= true
sim:
	SEEDS=$(SEEDS) FIRST_SEED=$(FIRST_SEED) DAYS=$(DAYS) PAYMENTS=$(PAYMENTS) \
	  $(if $(CRASH_RATE),CRASH_RATE=$(CRASH_RATE)) $(if $(AWS_FAULT_RATE),AWS_FAULT_RATE=$(AWS_FAULT_RATE)) \
	  $(if $(PROVIDER_FAULT_RATE),PROVIDER_FAULT_RATE=$(PROVIDER_FAULT_RATE)) $(if $(TRACE),TRACE=$(TRACE)) \
	  $(if $(MUTATION),MUTATION=$(MUTATION)) $(if $(FIFO),FIFO=$(FIFO)) \
	  $(if $(PROVIDER_OUTAGE_DAY),PROVIDER_OUTAGE_DAY=$(PROVIDER_OUTAGE_DAY)) \
	  $(if $(DYNAMODB_OUTAGE_DAY),DYNAMODB_OUTAGE_DAY=$(DYNAMODB_OUTAGE_DAY)) \
	  $(if $(SQS_OUTAGE_DAY),SQS_OUTAGE_DAY=$(SQS_OUTAGE_DAY)) \
	  $(if $(WEBHOOK_OUTAGE_DAY),WEBHOOK_OUTAGE_DAY=$(WEBHOOK_OUTAGE_DAY)) \
	  $(if $(PARAMETERS),PARAMETERS='$(PARAMETERS)') DISPUTE_SHARE=$(DISPUTE_SHARE) DISPUTE_DAYS=$(DISPUTE_DAYS) \
	  $(if $(SHOPPER_TEXT_SHARE),SHOPPER_TEXT_SHARE=$(SHOPPER_TEXT_SHARE)) \
	  $(if $(FORGED_EVENT_SHARE),FORGED_EVENT_SHARE=$(FORGED_EVENT_SHARE)) \
	  $(if $(filter true,$(SWEEP)),SWEEP=true) \
	  API_SHARE=$(API_SHARE) cargo run --profile perf -q -p simulator --bin sim $(if $(MUTATION),--features mutations)

## docs/performance.md's Capacity tiers on the simulated clock, at their settings, no injected
## faults: ten minutes of a steady load (TIER payments a second for 600 s, half through the API;
## a minute for TIER=10000), then a backlog of as many queued at once (straight to the queue, as
## after an outage). After each, what the Capacity table claims beside what was measured, each
## holds or DOES NOT HOLD: payments processed a second, provider requests refused, invocations
## at once, DynamoDB write units, the catch-up's lag.
## TIER=100 (the default, about 10 minutes of this machine): ProviderRequestsPerSecond 180,
##   MaximumConcurrency and ReservedConcurrency 20, the events route raised to 200 a second, the
##   payments API's throttle and ApiReservedConcurrency at their defaults (100 a second, burst
##   200; 20), a provider account of 180 requests a second.
## TIER=1000 (the 100 tier's settings times ten; both loads 29 minutes here): 1,800, 200 and 200, the route
##   at 2,000, the API at 1,000 (burst 2,000) with 200 reserved, an account of 1,800.
## TIER=10000 (one of the column's two stacks, each taking half the payments: 5,000 a second,
##   the middle column's settings times five, an account's half of 18,000; a minute steady and a
##   minute's backlog, 15 minutes here; its rate is not reached, docs/performance.md says why).
## CAPACITY_PARAMETERS='Name=Value ...' and CAPACITY_ACCOUNT_RATE change the settings.
TIER ?= 100
CAPACITY_RATE = $(if $(filter 10000,$(TIER)),5000,$(TIER))
CAPACITY_SECONDS = $(if $(filter 10000,$(TIER)),60,600)
CAPACITY_SCALE = $(if $(filter 100,$(TIER)),1,$(if $(filter 1000,$(TIER)),10,$(if $(filter 10000,$(TIER)),50,$(error TIER is 100, 1000 or 10000))))
CAPACITY_PARAMETERS ?= ProviderRequestsPerSecond=$(shell echo $$((180 * $(CAPACITY_SCALE)))) \
  MaximumConcurrency=$(shell echo $$((20 * $(CAPACITY_SCALE) > 1000 ? 1000 : 20 * $(CAPACITY_SCALE)))) \
  ReservedConcurrency=$(shell echo $$((20 * $(CAPACITY_SCALE) > 1000 ? 1000 : 20 * $(CAPACITY_SCALE)))) \
  ProviderEventsRateLimit=$(shell echo $$((200 * $(CAPACITY_SCALE)))) \
  PaymentsApiRateLimit=$(shell echo $$((100 * $(CAPACITY_SCALE)))) PaymentsApiBurstLimit=$(shell echo $$((200 * $(CAPACITY_SCALE)))) \
  ApiReservedConcurrency=$(shell echo $$((20 * $(CAPACITY_SCALE))))
CAPACITY_ACCOUNT_RATE ?= $(shell echo $$((180 * $(CAPACITY_SCALE))))
sim-capacity:
	for load in "$(CAPACITY_SECONDS) 0.5" "0 0"; do set -- $$load; \
	  PARAMETERS='$(CAPACITY_PARAMETERS)' cargo run --profile perf -q -p simulator --bin sim -- \
	    --seeds 1 --first 1 --payments $$(($(CAPACITY_RATE) * $(CAPACITY_SECONDS))) --days 0.1 --arrival-seconds $$1 --parallel-clients \
	    --api-share $$2 --refund-share 0 --dispute-share 0 --account-rate $(CAPACITY_ACCOUNT_RATE) \
	    --crash-rate 0 --aws-fault-rate 0 --provider-fault-rate 0 --claims $(TIER) || exit 1; \
	done

## The provider's timeline compressed: a year of late events (refunds failing weeks later, a customer
## authenticating, a debit settling, a dispute won, a refund months after the charge) with the
## processes' clock moved and DynamoDB's TTL applied at each step; prints the calendar. (make test
## runs the same calendar among the integration tests.)
timeline:
	bash infra/scripts/timeline.sh

## Offline template checks: cfn-lint, sam validate --lint, the transformed template, checkov.
check-template:
	bash infra/scripts/check-template.sh

## sam build of the arm64 bootstraps (ARCH=x86_64 for the other), each checked to be an ELF of that machine.
ARCH ?= arm64
package:
	bash infra/scripts/package.sh $(ARCH)

## sam build + sam deploy onto ministack, payments through the deployed API, stream, relay and event-source mapping.
e2e-sam:
	bash infra/scripts/e2e-sam.sh

## The benchmark: throughput, latency, calls per payment, CPU, memory, cold start, size.
bench:
	bash infra/scripts/bench.sh

## The operator's CLI, payctl, into ~/.cargo/bin.
install:
	cargo install --locked --path infra/payctl

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all

build:
	cargo build --workspace
