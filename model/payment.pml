/*
 * payment.pml -- SPIN model of the consumer protocol in shared/design.md:
 * claim (conditional write) -> charge (Idempotency-Key = payment_id) -> complete (fenced),
 * with the "look up before re-charging" rule for unknown outcomes.
 * (One file of ~570 lines: SPIN models are a single Promela file by convention.)
 *
 * One payment P.  Messages: m0, m1 carry P with payload A (a duplicate send);
 * m2 (NM=3) carries P with a different payload B (key reuse).
 * NW concurrent workers (Lambda invocations), each one attempt at a time.
 *
 * Variant switches (spin -a -DNAME=value payment.pml):
 *   LOOKUP  1: lookup rule present (V1)          0: blind retry (V2)
 *   FENCED  1: complete iff owner=me & INPROG    0: unconditional write (V3, Powertools-like)
 *   MARK    0: as specified: "unknown outcome" written only when an attempt ends
 *           1: fix: "charge may have been sent" written (fenced) before every provider call
 *   MARGIN  0: as specified: look up once now - first_attempt_at > R
 *           1: fix: look up once now - first_attempt_at > R - M, M > longest attempt
 *   GUARD   0: as specified: a worker may send the provider call after its lease expired
 *              (paused), and a call may land after the record was taken over (expired lease
 *              or FAILED after a client timeout)
 *           1: fix: send only while the own lease is valid (local clock, with margin), and a
 *              takeover (expired lease or FAILED) waits until no earlier call can still land
 *              (not_before = last send + client timeout + provider processing time)
 *   TAKEUNK 1: the code's alternative to MARK: a takeover of an expired IN_PROGRESS record
 *              always treats the outcome as unknown (the dead holder may have sent a call)
 *   OWNCLAIM   a claim's answer may be lost after the write was applied; the SDK's retry is
 *              refused and returns the worker's own lease (ALL_OLD):
 *           0: answers are never lost (the model as it was)
 *           1: the code: claimed, outcome unknown (what the write replaced is unknown)
 *           2: claimed, trusting the record's stored mark (what the write replaced is lost)
 *   BUDGET  1: a message handed back may instead be dead-lettered on its last receive
 *              (retries_exhausted), after the record was written
 *   SETTLE  1: the work waits for an outside event (a refund of a payment still settling):
 *              before any call, while the payment has not settled, a worker holds (a fenced
 *              write of the held entry on the payment, atomic with the payment's state), completes
 *              the record as held and acknowledges its message; once the payment settles, the
 *              Settler reopens a held record (COMPLETED/held -> FAILED) and sends a new message
 *              of the same payload, again as long as the held entry is there, and removes the
 *              entry once it reads the record completed with another outcome
 *           2: the same, but the worker that takes the reopened record removes the entry
 *              (fenced) before its call: S5 fails (the first design; README)
 *           3: as 1, and the Settler sends no message while an attempt holds the record (a
 *              live lease) or while a FAILED record may not be claimed yet (GUARD: a call may
 *              still land; the code's not_before): HeldRefunds::resume's busy and not-yet skips
 *   LIVE    1: environment may turn calm (no more crashes/slowness/losses); for L1
 *   NW, NM  workers (2..3), messages (2..3)
 *   CHK     bit set of safety properties to assert: 1 S1, 2 S2, 4 S3, 8 S4, 16 S5 (default 63;
 *           0 = no monitor, used for the liveness runs)
 */
#ifndef NW
#define NW 2
#endif
#ifndef NM
#define NM 3
#endif
#ifndef LOOKUP
#define LOOKUP 1
#endif
#ifndef FENCED
#define FENCED 1
#endif
#ifndef MARK
#define MARK 0
#endif
#ifndef MARGIN
#define MARGIN 0
#endif
#ifndef GUARD
#define GUARD 0
#endif
#ifndef LIVE
#define LIVE 0
#endif
#ifndef TAKEUNK
#define TAKEUNK 0
#endif
#ifndef OWNCLAIM
#define OWNCLAIM 0
#endif
#ifndef BUDGET
#define BUDGET 0
#endif
#ifndef REDRIVE
#define REDRIVE 1
#endif
#ifndef CHK
#define CHK 63
#endif
#ifndef SETTLE
#define SETTLE 0
#endif

#if LIVE
bit calm;                      /* from now on: no crash, no slowness, no loss, no 5xx/429 */
#define chaos (!calm)
bit holds[NW+1];               /* worker's current attempt holds the record (liveness only) */
#define HOLD(v) holds[me] = v
#define LEASE_DEAD (!holds[rec_owner])
#else
#define chaos 1
#define HOLD(v) skip
#define LEASE_DEAD 1
#endif

/* idempotency record status */
#define NONE      0
#define INPROG    1
#define COMPLETED 2
#define FAILED    3
/* recorded outcome */
#define O_OK   1
#define O_DECL 2
#define O_HELD 3   /* completed without a call: waits for the payment to settle (SETTLE) */
/* what the provider remembers for the key */
#define K_NONE 0
#define K_OK   1
#define K_DECL 2
#define K_500  3
/* SQS message state */
#define M_VIS  0
#define M_INFL 1
#define M_DONE 2
#define M_DLQ  3
#define M_NONE 4   /* not sent yet (the Settler's message, SETTLE) */
/* request slot of a worker: pending, or the answer */
#define Q_NONE 0
#define Q_PEND 1
#define A_OK   2
#define A_DECL 3
#define A_500  4   /* fresh 500 (charge may or may not be committed)      */
#define A_500R 5   /* replayed 500 (Idempotent-Replayed)                  */
#define A_429  6   /* rejected before execution: nothing happened         */
#define A_400  7   /* key already used with another payload               */
#define A_LOST 8   /* timeout / dropped connection: unknown outcome       */
/* claim conflicts and lookup results */
#define C_DUP   20
#define C_REUSE 21
#define C_BUSY  22
#define L_FOUND 30
#define L_NONE  31
#define L_INCON 32

/* ---- DynamoDB idempotency record (one payment) ---- */
byte rec_status;  byte rec_owner;  bit rec_live;  bit rec_hash;  byte rec_out;
bit  rec_unk;     /* "an earlier attempt may have charged" (unknown outcome marker) */

/* ---- provider ---- */
byte key;         /* what it remembers for Idempotency-Key = payment_id */
bit  key_hash;    /* payload the key was first used with                */
bit  key_old;     /* key stored more than R ago: may be forgotten        */
byte chA, chB;    /* committed charges for payload A / B (capped at 2)   */

/* ---- abstract time ---- */
bit sent_any;     /* t0: first charge request ever sent                   */
bit Rm;           /* now > t0 + R - M   (MARGIN only)                     */
bit Rel;          /* now > t0 + R                                         */
/* "nothing lives as long as R": an attempt or a request in the network
 * that was alive at t0 / at the Rm boundary / when the key was stored must
 * have ended before the next boundary. marks[w] = worker w's attempt (or its
 * orphaned request) was alive at that instant. */
bit pre0[NW+1]; bit prem[NW+1]; bit prek[NW+1];

/* ---- SQS ---- */
/* msg[NM] (SETTLE): the Settler's message for a held record, payload A */
byte msg[NM+SETTLE];
bit dlqA, dlqB;   /* a message of payload A / B was dead-lettered */
#if SETTLE
bit settled;      /* the payment the work waits for has settled (once, for good) */
bit held_entry;   /* the held entry on the payment's record */
#endif
#define PAYLOAD_B(i) (i == 2 && NM == 3)

/* ---- workers ---- */
bit  busy[NW+1];  byte cur[NW+1];       /* in an attempt; message held (+1)     */
byte req[NW+1];   bit reqh[NW+1];       /* outstanding provider call, answer    */
byte orph[NW+1];  /* request abandoned by its sender, still in the network (1+payload) */
byte completions; /* successful complete writes (ledger row + outbox event each) */

#define ALIVE(w) (busy[w] || orph[w] != 0)
#define UNMARK(w) if :: !ALIVE(w) -> pre0[w] = 0; prem[w] = 0; prek[w] = 0 :: else -> skip fi
#if NW == 2
#define MARKALL(a) a[1] = ALIVE(1); a[2] = ALIVE(2)
#define ANY(a) (a[1] || a[2])
#define ANYBUSY (busy[1] || busy[2])
#define NETIDLE (req[1] != Q_PEND && req[2] != Q_PEND && orph[1] == 0 && orph[2] == 0)
#define HELD(i) ((busy[1] && cur[1] == i+1) || (busy[2] && cur[2] == i+1))
#else
#define MARKALL(a) a[1] = ALIVE(1); a[2] = ALIVE(2); a[3] = ALIVE(3)
#define ANY(a) (a[1] || a[2] || a[3])
#define ANYBUSY (busy[1] || busy[2] || busy[3])
#define NETIDLE (req[1] != Q_PEND && req[2] != Q_PEND && req[3] != Q_PEND && \
                 orph[1] == 0 && orph[2] == 0 && orph[3] == 0)
#define HELD(i) ((busy[1] && cur[1] == i+1) || (busy[2] && cur[2] == i+1) || (busy[3] && cur[3] == i+1))
#endif
#if MARGIN
#define RCHECK Rm
#else
#define RCHECK Rel
#endif

#define INC2(x) x = (x < 2 -> x + 1 : 2)
#define CHARGE(hh) if :: hh == 0 -> INC2(chA) :: else -> INC2(chB) fi

/* A crash (or Lambda timeout) at this point of the attempt: everything local is
 * lost; a call still in the network may land later; the message stays in
 * flight until its visibility timeout; the lease stays until it expires. */
#define CRASH \
  if :: req[me] == Q_PEND -> orph[me] = 1 + reqh[me] :: else -> skip fi; \
  req[me] = Q_NONE; reqh[me] = 0; busy[me] = 0; cur[me] = 0; HOLD(0); UNMARK(me); \
  m = 0; h = 0; unk = 0; a = 0; o = 0; ph = 0

#define END_ATTEMPT \
  busy[me] = 0; cur[me] = 0; HOLD(0); UNMARK(me); m = 0; h = 0; unk = 0; a = 0; o = 0; ph = 0

#define TODLQ(i) \
  if :: PAYLOAD_B(i) -> dlqB = 1 :: else -> dlqA = 1 fi; \
  if :: msg[i] != M_DONE -> msg[i] = M_DLQ :: else -> skip fi

/* The provider executes one request for key payment_id with payload hh. */
inline execute(hh, r) {
  if
  :: chaos -> r = A_429                               /* 429/409: nothing executed      */
  :: key == K_NONE ->                                 /* first execution for this key   */
       key_hash = hh; key_old = 0; MARKALL(prek);
       if
       :: r = A_OK;   key = K_OK;   CHARGE(hh)
       :: r = A_DECL; key = K_DECL                    /* card declined (402)            */
       :: chaos -> r = A_500; key = K_500; CHARGE(hh)  /* committed, then answered 500   */
       :: chaos -> r = A_500; key = K_500              /* failed before commit, 500      */
       fi
  :: key != K_NONE && key_hash != hh -> r = A_400     /* same key, other payload        */
  :: key != K_NONE && key_hash == hh ->               /* dedupe: replay the first result */
       if
       :: key == K_OK   -> r = A_OK
       :: key == K_DECL -> r = A_DECL
       :: key == K_500  -> r = A_500R
       fi
  fi
}

/* a request whose sender gave up (timeout, crash) lands late; nobody gets the answer */
#if NW > 2
#define ORPHAN3 :: atomic { orph[3] != 0 -> execute(orph[3] - 1, r); orph[3] = 0; UNMARK(3); r = 0 }
#else
#define ORPHAN3
#endif
#define ORPHANS \
  :: atomic { orph[1] != 0 -> execute(orph[1] - 1, r); orph[1] = 0; UNMARK(1); r = 0 } \
  :: atomic { orph[2] != 0 -> execute(orph[2] - 1, r); orph[2] = 0; UNMARK(2); r = 0 } \
  ORPHAN3

proctype Worker(byte me)
{
  byte m; bit h; bit unk; byte a; byte o; bit ph;   /* ph=1: lookup after a replayed 500 */
  bit lc;                                           /* the claim's answer was lost (OWNCLAIM) */

end_idle:
  /* receive a visible message and claim in one step (the receive alone changes nothing
   * another worker could observe except the message's visibility) */
  atomic {
    if
    :: msg[0] == M_VIS -> m = 0
    :: msg[1] == M_VIS -> m = 1
#if NM > 2
    :: msg[2] == M_VIS -> m = 2
#endif
#if SETTLE
    :: msg[NM] == M_VIS -> m = NM
#endif
    fi;
    msg[m] = M_INFL; h = PAYLOAD_B(m); busy[me] = 1; cur[me] = m + 1;
    /* Claim: attribute_not_exists(pk) OR (payload_hash = :h AND
     *        ((status = IN_PROGRESS AND lease expired) OR status = FAILED)); ALL_OLD on conflict */
    if
    :: rec_status == NONE ->
         rec_status = INPROG; rec_owner = me; rec_live = 1; rec_hash = h; rec_unk = 0; unk = 0; HOLD(1);
         if :: OWNCLAIM && chaos -> lc = 1 :: true -> skip fi
    :: rec_status != NONE && rec_hash == h &&
       ((rec_status == INPROG && !rec_live) || rec_status == FAILED) && (!GUARD || NETIDLE) ->
         unk = rec_unk;
         if :: TAKEUNK && rec_status == INPROG -> unk = 1 :: else -> skip fi;
         rec_status = INPROG; rec_owner = me; rec_live = 1; HOLD(1);
         if :: OWNCLAIM && chaos -> lc = 1 :: true -> skip fi
    :: else ->
         if
         :: rec_hash == h && rec_status == COMPLETED -> a = C_DUP
         :: rec_hash != h -> a = C_REUSE
         :: else -> a = C_BUSY                       /* live lease held by someone */
         fi
    fi
  };
#if OWNCLAIM
  /* The claim was applied but its answer lost; the retry is refused with our own lease. */
  if
  :: lc ->
       lc = 0;
#if OWNCLAIM == 1
       unk = 1                          /* what the write replaced is unknown */
#else
       unk = rec_unk                    /* trust the stored mark */
#endif
  :: else -> skip
  fi;
#endif
  if
  :: a == C_DUP   -> goto ack          /* duplicate: ack, charge nothing */
  :: a == C_REUSE -> goto deadletter   /* key reuse with another payload  */
  :: a == C_BUSY  -> goto release      /* leave it for redelivery         */
  :: a == 0 -> skip
  fi;

#if LOOKUP
  /* The rule under test: an earlier attempt ended with an unknown outcome and the
   * provider may have forgotten the key -> look up before any new charge. */
  if
  :: unk && RCHECK -> goto lookup
  :: else -> skip
  fi;
#endif

#if SETTLE
  /* The work's own decision, before any call, on the payment's record (one conditional
   * write fenced by the lease): hold while it has not settled; once it has, take the held
   * entry (a resumed refund converts its held reservation) and go on to the call. */
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
    :: rec_owner == me && rec_status == INPROG && !settled -> held_entry = 1; o = O_HELD
#if SETTLE == 2
    :: rec_owner == me && rec_status == INPROG && settled -> held_entry = 0
#else
    :: rec_owner == me && rec_status == INPROG && settled -> skip
#endif
    :: else -> goto stop
    fi
  };
  if :: o == O_HELD -> goto complete :: else -> skip fi;
#endif

charge:
#if MARK
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
    :: rec_owner == me && rec_status == INPROG -> rec_unk = 1; unk = 1
    :: else -> goto stop
    fi
  };
#endif
  atomic {                                            /* send the provider call */
    if
    :: chaos -> CRASH; goto end_idle
#if GUARD
    :: !(rec_owner == me && rec_status == INPROG && rec_live) -> goto stop  /* lease too short */
    :: rec_owner == me && rec_status == INPROG && rec_live ->
#else
    :: true ->
#endif
       req[me] = Q_PEND; reqh[me] = h;
       if :: !sent_any -> sent_any = 1; MARKALL(pre0) :: else -> skip fi
    fi
  };
  atomic {                                            /* wait for the answer */
    if
    :: chaos -> CRASH; goto end_idle                  /* after send / after the provider acted */
    :: req[me] >= A_OK -> a = req[me]; req[me] = Q_NONE
    :: chaos && req[me] == Q_PEND ->                  /* client timeout; the call may still land */
         a = A_LOST; orph[me] = 1 + h; req[me] = Q_NONE
    fi
  };
  if
  :: a == A_OK   -> o = O_OK;   goto heartbeat
  :: a == A_DECL -> o = O_DECL; goto heartbeat
  :: a == A_400  -> goto deadletter
  :: a == A_429  -> goto failed                       /* transient, known: nothing executed */
  :: a == A_500 || a == A_LOST -> unk = 1; goto failed
  :: a == A_500R ->
       unk = 1;
#if LOOKUP
       ph = 1; goto lookup                            /* replaying a 500: look it up */
#else
       goto failed
#endif
  fi;

lookup:                                               /* search the provider by payment_id */
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
    :: chaos -> a = L_INCON                           /* search failed / not settled */
    :: chA + chB > 0  -> a = L_FOUND
    :: chA + chB == 0 -> a = L_NONE
    fi
  };
  if
  :: a == L_FOUND -> o = O_OK; goto heartbeat
  :: a == L_INCON -> goto unknown_dlq
  :: a == L_NONE && ph == 0 -> a = 0; goto charge     /* proven: no charge -> charge */
  :: a == L_NONE && ph == 1 -> goto failed            /* same key would replay the 500 */
  fi;

heartbeat:                                            /* optional lease renewal before completing */
  if
  :: skip
  :: atomic {
       if
       :: chaos -> CRASH; goto end_idle
       :: rec_owner == me && rec_status == INPROG -> rec_live = 1
       :: else -> goto stop                           /* renewal failed: ownership lost */
       fi
     }
  fi;

complete:
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
#if FENCED
    :: rec_owner == me && rec_status == INPROG ->
         rec_status = COMPLETED; rec_out = o; rec_live = 0;
         if :: o != O_HELD -> INC2(completions) :: else -> skip fi
    :: else -> goto stop
#else
    :: true ->                                        /* unconditional update, like Powertools */
         rec_status = COMPLETED; rec_out = o; rec_live = 0; INC2(completions)
#endif
    fi
  };
ack:                                                  /* delete the message */
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
    :: true ->
       if :: msg[m] != M_DLQ -> msg[m] = M_DONE :: else -> skip fi;
       END_ATTEMPT; goto end_idle
    fi
  };

failed:                                               /* record FAILED (fenced), redeliver */
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
    :: rec_owner == me && rec_status == INPROG ->
         rec_status = FAILED; rec_unk = rec_unk | unk; rec_live = 0
    :: else -> goto stop
    fi
  };
release:                                              /* batch item failure: visible again later */
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
    :: true ->
       if :: msg[m] == M_INFL -> msg[m] = M_VIS :: else -> skip fi;
       END_ATTEMPT; goto end_idle
#if BUDGET
    :: chaos -> TODLQ(m); END_ATTEMPT; goto end_idle  /* last receive: retries_exhausted */
#endif
    fi
  };

unknown_dlq:                                          /* outcome_unknown */
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
    :: rec_owner == me && rec_status == INPROG ->
         rec_status = FAILED; rec_unk = 1; rec_live = 0
    :: else -> skip
    fi
  };
deadletter:
  atomic {
    if
    :: chaos -> CRASH; goto end_idle
    :: true -> TODLQ(m); END_ATTEMPT; goto end_idle
    fi
  };

stop:                                                 /* ownership lost: touch nothing, exit */
  atomic { END_ATTEMPT; goto end_idle }
}

#if !LIVE
active proctype Provider()
{
  byte r;
end_p:
  do
  :: atomic { req[1] == Q_PEND -> execute(reqh[1], r);
       if :: req[1] = r :: chaos -> req[1] = A_LOST fi; r = 0 }  /* answer delivered or lost */
  :: atomic { req[2] == Q_PEND -> execute(reqh[2], r);
       if :: req[2] = r :: chaos -> req[2] = A_LOST fi; r = 0 }
#if NW > 2
  :: atomic { req[3] == Q_PEND -> execute(reqh[3], r);
       if :: req[3] = r :: chaos -> req[3] = A_LOST fi; r = 0 }
#endif
  ORPHANS
  od
}
#else
/* Liveness runs: the same provider, one process per outstanding call (live or late),
 * so that weak (per-process) fairness means "every call is eventually answered or lands";
 * with a single provider process, SPIN's fairness would let it starve one caller. */
proctype Link(byte w)
{
  byte r;
end_l:
  do
  :: atomic { req[w] == Q_PEND -> execute(reqh[w], r);
       if :: req[w] = r :: chaos -> req[w] = A_LOST fi; r = 0 }
  od
}
proctype Late(byte w)
{
  byte r;
end_t:
  do
  :: atomic { orph[w] != 0 -> execute(orph[w] - 1, r); orph[w] = 0; UNMARK(w); r = 0 }
  od
}
#endif

active proctype Env()
{
end_e:
  do
  /* lease expiry: only if its owner has stopped/crashed, or is slow (a zombie) */
  :: atomic { rec_status == INPROG && rec_live && (chaos || LEASE_DEAD) -> rec_live = 0 }
  /* visibility timeout: holder gone, or slow -> redelivery (maybe to a second worker) */
  :: atomic { msg[0] == M_INFL && (chaos || !HELD(0)) -> msg[0] = M_VIS }
  :: atomic { msg[1] == M_INFL && (chaos || !HELD(1)) -> msg[1] = M_VIS }
#if NM > 2
  :: atomic { msg[2] == M_INFL && (chaos || !HELD(2)) -> msg[2] = M_VIS }
#endif
#if SETTLE
  :: atomic { msg[NM] == M_INFL && (chaos || !HELD(NM)) -> msg[NM] = M_VIS }
#endif
#if REDRIVE
  /* operator redrives the DLQ to the source queue */
  :: atomic { chaos && msg[0] == M_DLQ -> msg[0] = M_VIS }
  :: atomic { chaos && msg[1] == M_DLQ -> msg[1] = M_VIS }
#if SETTLE
  :: atomic { chaos && msg[NM] == M_DLQ -> msg[NM] = M_VIS }
#endif
#endif
  /* the network drops an abandoned request */
  :: atomic { chaos && orph[1] != 0 -> orph[1] = 0; UNMARK(1) }
  :: atomic { chaos && orph[2] != 0 -> orph[2] = 0; UNMARK(2) }
#if NW > 2
  :: atomic { chaos && orph[3] != 0 -> orph[3] = 0; UNMARK(3) }
#endif
  /* time passes */
#if MARGIN
  :: atomic { sent_any && !Rm && !ANY(pre0) -> Rm = 1; MARKALL(prem) }
  :: atomic { Rm && !Rel && !ANY(prem) -> Rel = 1 }
#else
  :: atomic { sent_any && !Rel && !ANY(pre0) -> Rel = 1 }
#endif
  :: atomic { Rel && key != K_NONE && !key_old && !ANY(prek) -> key_old = 1 }
  /* the provider forgets the key (retention R over) */
  :: atomic { key != K_NONE && key_old -> key = K_NONE; key_old = 0 }
#if LIVE
  :: atomic { !calm -> calm = 1 }
#endif
  od
}

#if SETTLE
/* The payment settles once; then whatever applies it (the inbox after its write, again on
 * every redelivery of its event, the scheduled sweep) reopens a held record and sends its
 * message, for as long as the held entry is on the payment's record, and removes the entry
 * once the record is completed with another outcome. Each step may be cut short by a crash:
 * it runs again. */
active proctype Settler()
{
end_s:
  do
  :: atomic { !settled -> settled = 1 }
  /* One resume, as HeldRefunds::resume makes it: a record completed otherwise is done and its
   * entry goes; else a record still completed held is reopened, then its message is sent,
   * unless the resume stops (crashes) before the send, or a message of it is still out (the
   * model has one slot for it; duplicates of a message are m0/m1's). SETTLE=3 also leaves a
   * record an attempt holds, or one whose claim must wait, as the code's resume does: the
   * inbox's event (or the next sweep) comes back for it. */
  :: atomic { settled && held_entry ->
       if
       :: rec_status == COMPLETED && rec_out != O_HELD -> held_entry = 0
       :: else ->
            if
            :: rec_status == COMPLETED && rec_out == O_HELD -> rec_status = FAILED
            :: else -> skip
            fi;
            if
            :: chaos -> skip
#if SETTLE == 3
            :: (msg[NM] == M_NONE || msg[NM] == M_DONE) &&
               !(rec_status == INPROG && rec_live) &&
               !(rec_status == FAILED && GUARD && !NETIDLE) -> msg[NM] = M_VIS
#else
            :: msg[NM] == M_NONE || msg[NM] == M_DONE -> msg[NM] = M_VIS
#endif
            :: else -> skip
            fi
       fi }
  od
}
#endif

/* ---- properties ---- */
#define S1 (chA + chB <= 1)                               /* at most one charge at the provider */
#define S2 (rec_status != COMPLETED || \
            ((rec_out == O_OK) == ((rec_hash == 0 && chA > 0) || (rec_hash == 1 && chB > 0))))
#define S3 (!(chA > 0 && chB > 0))                        /* never both payloads charged */
#define S4 (completions <= 1)                             /* one ledger row / outbox event */
#define DONEA ((msg[0] == M_DONE || msg[0] == M_DLQ) && (msg[1] == M_DONE || msg[1] == M_DLQ))
#if SETTLE
/* a held record is not done: the held entry (which the Settler answers) must still be there */
#define DONER (msg[NM] == M_NONE || msg[NM] == M_DONE || msg[NM] == M_DLQ)
#define S5 (!(DONEA && DONER && !ANYBUSY) || (rec_status == COMPLETED && rec_out != O_HELD) || \
            dlqA || held_entry)
#else
#define S5 (!(DONEA && !ANYBUSY) || (rec_status == COMPLETED) || dlqA)  /* nothing lost */
#endif

#if CHK
active proctype Monitor()
{
end_m:
  do
#if CHK & 1
  :: atomic { !S1 -> assert(S1) }
#endif
#if CHK & 2
  :: atomic { !S2 -> assert(S2) }
#endif
#if CHK & 4
  :: atomic { !S3 -> assert(S3) }
#endif
#if CHK & 8
  :: atomic { !S4 -> assert(S4) }
#endif
#if CHK & 16
  :: atomic { !S5 -> assert(S5) }
#endif
  od
}
#endif

init {
  atomic {
#if SETTLE
    msg[NM] = M_NONE;
#endif
    run Worker(1); run Worker(2);
#if NW > 2
    run Worker(3);
#endif
#if LIVE
    run Link(1); run Link(2); run Late(1); run Late(2);
#if NW > 2
    run Link(3); run Late(3);
#endif
#endif
  }
}

#if LIVE
#if SETTLE
#define DONE ((rec_status == COMPLETED && rec_out != O_HELD) || dlqA)
#else
#define DONE (rec_status == COMPLETED || dlqA)
#endif
ltl L1 { (<> calm) -> (<> DONE) }
#endif
