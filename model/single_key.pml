/*
 * single_key.pml: the claim / takeover / fencing protocol of one scoped
 * idempotency key, checked with SPIN. docs/model.md maps every step to the
 * code that implements it.
 *
 *   clients  NSAME clients send command 1 under the key (two of them race),
 *            NREUSE clients send command 2 under the same key (a buggy
 *            client); each retries a non-final answer, on any node, up to
 *            MAXTRY calls, and may resend a final one once.
 *   nodes    NN node processes run engine.Do for a request; the last one
 *            also runs recovery passes (engine.RecoverStale); a node may
 *            crash at any step and restart with nothing.
 *   store    one record, every statement atomic: the insert-first claim,
 *            the decision (idem.Decide) and takeover, fenced checkpoint,
 *            complete and fail writes; a commit's answer can be lost (the
 *            write may or may not have happened).
 *   etcd     recovery locks under leases; a lock's token is a revision
 *            (tokens grow); a lease ends when its node died or (a fault)
 *            while its owner is paused.
 *   provider deduplicates by provider key (derived from the command and the
 *            record's generation) and rejects a token lower than the
 *            highest it has seen for the key.
 *   clock    the store's clock: an owner's lock runs out (at once if the
 *            owner is gone, or as a fault while it is paused) and a settled
 *            record's window ends (once).
 *
 * Faults (crashes, lost commits and provider answers, client timeouts,
 * pauses past a lease) draw on one budget, MAXFAULT, so that they stop.
 *
 * Broken variants (each must be refuted): -DFIND_THEN_INSERT,
 * -DNO_FENCING, -DRAW_BODY_HASH.
 */

#ifndef NSAME
#define NSAME 2
#endif
#ifndef NREUSE
#define NREUSE 1
#endif
#define NC (NSAME + NREUSE)
#define NN 2
#ifndef MAXTRY
#define MAXTRY 3
#endif
#ifndef REUSETRY
#define REUSETRY 2   /* calls of the reusing client */
#endif
#ifndef MAXFAULT
#define MAXFAULT 1
#endif
#ifndef RECOVERY
#define RECOVERY 1   /* the last node runs recovery passes */
#endif
#ifndef MAXEXP
#define MAXEXP 1
#endif
#define NGEN (MAXEXP + 1)

/* record states (idem.Status) */
#define NONE   0
#define INPROG 1   /* IN_PROGRESS */
#define DONE   2   /* COMPLETED */
#define RETRY  3   /* FAILED_RETRYABLE */
#define UNK    4   /* UNKNOWN_REQUIRES_RECOVERY */
#define OPEN(s) ((s) == INPROG || (s) == UNK)
#define SETTLED(s) ((s) == DONE || (s) == RETRY)

/* checkpoints: RECEIVED / LOCAL_PAYMENT_CREATED (nothing sent downstream)
 * and PROVIDER_REQUEST_SENT (the provider may have charged) */
#define RCV  0
#define SENT 1

/* answers a client can get */
#define A_NONE     0
#define A_LOST     1   /* connection lost, timeout */
#define A_INPROG   2   /* 409 IDEMPOTENCY_REQUEST_IN_PROGRESS */
#define A_UNKNOWN  3   /* 202 PAYMENT_OUTCOME_UNKNOWN */
#define A_UNAVAIL  4   /* 503, nothing charged */
#define A_CONFLICT 5   /* 409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST */
#define A_OK       16  /* 201: A_OK + charge id */
#define FINAL(a) ((a) == A_CONFLICT || (a) >= A_OK)

/* decisions (idem.Outcome) */
#define O_EXEC     1
#define O_RECOVER  2
#define O_EXPIRED  3
#define O_REPLAY   4
#define O_CONFLICT 5
#define O_INPROG   6

/* provider answers */
#define P_OK      1
#define P_STALE   2
#define P_UNAVAIL 3   /* 5xx: nothing charged */
#define P_AMBIG   4   /* sent, no answer: may have charged */

#define CMDOF(c) ((c) < NSAME -> 1 : 2)
#ifdef RAW_BODY_HASH
#define HASH(cmd, ser) ((cmd) * 2 + (ser))  /* the bytes, not the command */
#else
#define HASH(cmd, ser) ((cmd) * 2)          /* the canonical command */
#endif
/* provider key: derived from the durable identity (command, generation) */
#define PK(cmd, g) (((cmd) - 1) * NGEN + (g))
#define NPK (2 * NGEN + NC)   /* derived keys, then random ones (find-then-insert) */

/* ---------------- store: the one record ---------------- */
byte st;          /* status */
bit  cp;          /* checkpoint */
byte tok;         /* fencing_token */
bit  locked;      /* locked_until > now() */
byte rhash;       /* request_hash */
byte gen;         /* generation */
byte rpk;         /* the payment's provider key (resource) */
byte rans;        /* stored answer: charge id */
byte claimid;     /* claim_id (the claiming node) */
byte owner;       /* node of the owner's lease */
bit  expired;     /* expires_at <= now() */
byte nexp;        /* windows ended so far */

/* ---------------- etcd: recovery locks ---------------- */
byte rev = 1;     /* etcd revision */
byte lk;          /* holder of the scope's lock: node + 1, 0 free */
byte lktok;       /* its create revision */

/* ---------------- provider ---------------- */
bit  pch[NPK];    /* charged */
byte ptok[NPK];   /* highest fencing token seen */
byte rnd;         /* random provider keys drawn (find-then-insert) */

/* ---------------- network ---------------- */
chan req[NN] = [0] of { byte, byte, bit };   /* client, tag, serialisation */
byte tag[NC];     /* each client's current call */
byte ans[NC];     /* the answer to it */

/* ---------------- faults ---------------- */
byte faults;
byte own[NN];     /* token a node works under (0: none): a live owner */

/* ---------------- ghosts: what the properties look at ---------------- */
byte effects[NGEN];   /* charges made per generation */
byte bound[NGEN];     /* the command that took each generation */
byte ack[NGEN];       /* the charge id a client was answered 201 with */
byte phigh[NPK];      /* highest real token that reached each provider key */
byte shigh;           /* highest token the store granted or accepted */

#define FAULT (faults < MAXFAULT)

/* An acknowledged answer is never lost: while the generation a client was
 * answered in lasts, the record holds that answer. */
#define ACK_KEPT (ack[gen] == 0 || expired || (st == DONE && rans == ack[gen]))

active proctype monitor()
{
end:	atomic { !ACK_KEPT -> assert(false) }
}

/* Deliver answer a to client c's call t (dropped if the client moved on). */
inline reply(c, t, a)
{
	if
	:: c < NC && tag[c] == t ->
		if
		:: a >= A_OK ->
			/* Replay is a contract: every 201 for a generation is the same */
			assert(ack[g] == 0 || ack[g] == a - A_OK);
			ack[g] = a - A_OK
		:: a == A_CONFLICT ->
			/* Same key, different command is an error, and only then */
			assert(CMDOF(c) != bound[g])
		:: else -> skip
		fi;
		ans[c] = a
	:: else -> skip
	fi
}

/* A fenced write's WHERE clause (store.fenced): the writer's token and an
 * open record. Without fencing (payments' BreakNoFencing) the key alone. */
#ifdef NO_FENCING
#define FENCED_OK (true)
#else
#define FENCED_OK (tok == mytok && OPEN(st))
#endif

/* Fencing across all of it: a write the store applies never carries a token
 * lower than one it has granted or accepted. */
#define APPLY_CHECK assert(mytok >= shigh); shigh = mytok

proctype node(byte n)
{
	byte c, t, cmd, h, g, pk, mytok, expect, a, out, res;
	bit ser, bg, haslock, ok, again;

end_idle:
	if
	:: req[n] ? c, t, ser -> cmd = CMDOF(c); h = HASH(cmd, ser)
	:: atomic {
		/* engine.RecoverStale: ListStale finds a record nobody works on */
		RECOVERY && n == NN - 1 && OPEN(st) && !locked ->
			c = NC; bg = 1; expect = tok; h = rhash; cmd = bound[gen]
	   }
	fi;

claim:
	/* store.Begin: ReadSettled, then INSERT ... ON CONFLICT DO NOTHING, or
	 * idem.Decide on the record and a conditional takeover, in one
	 * transaction. */
	atomic {
		g = gen; out = O_INPROG;
		if
		:: st == NONE ->
#ifdef FIND_THEN_INSERT
			goto naive   /* the read found nothing: insert later */
#else
			if
			:: FAULT -> faults++; again = 1;   /* the commit's answer is lost */
				if
				:: true -> goto inserted
				:: true -> goto claimed        /* it did not commit */
				fi
			:: true -> skip
			fi;
inserted:
			st = INPROG; cp = RCV; tok = 1; locked = 1; rhash = h; rpk = PK(cmd, gen);
			claimid = n + 1; owner = n; bound[gen] = cmd;
			if :: tok > shigh -> shigh = tok :: else -> skip fi;
			if
			:: again -> skip              /* the node does not know yet */
			:: else -> mytok = 1; own[n] = 1; goto owned
			fi
#endif
		:: st != NONE && !bg && SETTLED(st) && expired ->
			/* a key reused after its window: a new generation, under
			 * the store's counter */
			tok++; gen++; g = gen; st = INPROG; cp = RCV; locked = 1;
			rhash = h; rpk = PK(cmd, gen); claimid = n + 1; owner = n; expired = 0;
			bound[gen] = cmd; mytok = tok; own[n] = tok;
			APPLY_CHECK; goto owned
		:: st != NONE && !(!bg && SETTLED(st) && expired) ->
			if
			:: bg && tok != expect -> skip   /* another got there first */
			:: rhash != h -> out = O_CONFLICT
			:: rhash == h && st == DONE -> out = O_REPLAY; a = A_OK + rans
			:: rhash == h && OPEN(st) && locked -> skip
			:: rhash == h && (st == RETRY || OPEN(st) && !locked) && (!bg || tok == expect) ->
#ifdef NO_FENCING
				/* no external lock: the store's own counter, at once */
				tok++; mytok = tok; st = INPROG; locked = 1;
				claimid = n + 1; owner = n; own[n] = tok; APPLY_CHECK; goto owned
#else
				out = O_RECOVER   /* take the lock first */
#endif
			fi
		fi
	};
claimed:
	atomic {
		if
		:: again ->
			/* Begin decides again: it finds the record its claim id
			 * took and goes on with it, or a free key, or another's */
			again = 0;
			if
			:: claimid == n + 1 && st == INPROG && tok == 1 ->
				mytok = tok; own[n] = tok; goto owned
			:: else -> goto claim
			fi
		:: !again && out == O_CONFLICT -> a = A_CONFLICT; goto answer
		:: !again && out == O_REPLAY -> goto answer
		:: !again && out == O_INPROG -> a = A_INPROG; goto answer
		:: !again && out == O_RECOVER ->
			/* engine.claim: a takeover is made under the scope's etcd
			 * lock, whose create revision is the fencing token */
			if
			:: lk != 0 -> a = A_INPROG; goto answer   /* idem.ErrLocked */
			:: else -> rev++; lk = n + 1; lktok = rev; haslock = 1; mytok = rev; own[n] = rev
			fi
		fi
	};
	atomic {
		/* Begin again with the lock's token (the recovery worker's record
		 * must still be the one it listed) */
		g = gen; a = A_INPROG;
		if
		:: bg && tok != expect -> goto answer
		:: rhash != h -> a = A_CONFLICT; goto answer
		:: rhash == h && st == DONE -> a = A_OK + rans; goto answer
		:: rhash == h && OPEN(st) && locked -> goto answer
		:: rhash == h && (OPEN(st) && !locked || st == RETRY) && mytok <= tok ->
			goto answer    /* idem.ErrFenced */
		:: rhash == h && (OPEN(st) && !locked || st == RETRY) && mytok > tok && (!bg || tok == expect) ->
			tok = mytok; st = INPROG; locked = 1; claimid = n + 1; owner = n;
			APPLY_CHECK
		fi
	};

owned:
	/* the record is this attempt's; its checkpoint is how far an earlier
	 * owner got. The payment the record names gives the provider key. */
	atomic {
		pk = rpk;
		if
		:: FAULT -> faults++; goto crash
		:: cp == RCV && bg -> goto release   /* the worker never executes without a client */
		:: cp == RCV && !bg -> goto execute
		:: cp == SENT -> skip
		fi
	};

	/* payments.drive: an earlier owner may have reached the provider: ask
	 * first (provider.Client.Lookup) */
	atomic {
		if
		:: FAULT -> faults++; goto unknown
		:: pch[pk] -> goto confirm
		:: !pch[pk] -> skip
		fi
	};

execute:
	/* fenced write: checkpoint PROVIDER_REQUEST_SENT */
	atomic {
		if
		:: FAULT -> faults++; goto crash
		:: FENCED_OK -> APPLY_CHECK; cp = SENT
		:: !FENCED_OK -> a = A_INPROG; goto answer
		fi
	};
	/* Attempt.Check, then provider.Client.Charge with the provider key and
	 * the token (the check and the call are two steps: a pause between
	 * them is what the tokens are for) */
	atomic {
		if
		:: haslock && !(lk == n + 1 && lktok == mytok) -> a = A_INPROG; goto answer
		:: else -> skip
		fi
	};
	atomic {
		if
		:: FAULT -> faults++; goto crash
		:: FAULT -> faults++; goto release      /* 5xx: nothing charged */
		:: FAULT -> faults++; goto unknown      /* lost on the way */
#ifndef NO_FENCING
		:: mytok < ptok[pk] -> a = A_INPROG; goto answer   /* FENCING_TOKEN_STALE */
		:: mytok >= ptok[pk] ->
			ptok[pk] = mytok;
#else
		:: true ->   /* no token sent */
#endif
			/* Fencing: the provider never acts for a token lower than
			 * one it has seen for the key */
			assert(mytok >= phigh[pk]); phigh[pk] = mytok;
			if
			:: !pch[pk] -> pch[pk] = 1;
				/* at most one effect per key and generation */
				effects[g]++; assert(effects[g] <= 1);
				/* a different command under a key is never executed */
				assert(cmd == bound[g])
			:: else -> skip
			fi;
			if
			:: FAULT -> faults++; goto unknown   /* charged, the answer is lost */
			:: true -> skip
			fi
		fi
	};

confirm:
	/* fenced write: COMPLETED with the charge's answer */
	atomic {
		if
		:: FAULT -> faults++; goto crash
		:: FENCED_OK -> APPLY_CHECK; a = A_OK + pk + 1;
			if
			:: FAULT -> faults++;
				/* the commit's answer is lost, whether it committed or
				 * not: the request is attempted again (Request.RetryOn)
				 * and the record answers what the commit did */
				if :: st = DONE; rans = pk + 1; locked = 0 :: skip fi;
				own[n] = 0;
				if :: haslock && lk == n + 1 && lktok == mytok -> lk = 0 :: else -> skip fi;
				haslock = 0;
				if :: bg -> goto answer :: else -> goto claim fi
			:: true -> st = DONE; rans = pk + 1; locked = 0
			fi
		:: !FENCED_OK -> a = A_INPROG
		fi;
		goto answer
	};

unknown:
	/* fenced write: UNKNOWN_REQUIRES_RECOVERY, lock released */
	atomic {
		if
		:: FENCED_OK -> APPLY_CHECK; st = UNK; locked = 0; a = A_UNKNOWN
		:: else -> a = A_INPROG
		fi;
		goto answer
	};

release:
	/* engine.releaseErr: checkpoint RECEIVED, then FAILED_RETRYABLE */
	atomic {
		if
		:: FENCED_OK -> APPLY_CHECK; cp = RCV
		:: else -> a = A_INPROG; goto answer
		fi
	};
	atomic {
		if
		:: FENCED_OK -> APPLY_CHECK; st = RETRY; locked = 0; a = A_UNAVAIL
		:: else -> a = A_INPROG
		fi;
		goto answer
	};

#ifdef FIND_THEN_INSERT
naive:
	/* payments.claimFindThenInsert: a payment with a random id, and the
	 * record written whatever is there (store.UpsertCompleted) */
	atomic {
		rnd++; pk = 2 * NGEN + rnd - 1; g = gen;
		if :: st == NONE -> bound[g] = cmd; rhash = h :: else -> skip fi;
		pch[pk] = 1; effects[g]++; assert(effects[g] <= 1); assert(cmd == bound[g]);
		st = DONE; cp = SENT; rans = pk + 1; rpk = pk; locked = 0;
		a = A_OK + pk + 1;
		goto answer
	};
#endif

crash:
	/* the node dies: its client's connection drops, its lease (and lock)
	 * lapse in etcd later, its work is lost; it restarts empty */
	atomic {
		haslock = 0; a = A_LOST;
		goto answer
	};

answer:
	atomic {
		if
		:: haslock && lk == n + 1 && lktok == mytok -> lk = 0   /* Unlock */
		:: else -> skip
		fi;
		reply(c, t, a);
		own[n] = 0; c = 0; t = 0; cmd = 0; h = 0; g = 0; pk = 0; mytok = 0;
		expect = 0; a = 0; out = 0; res = 0; ser = 0; bg = 0; haslock = 0; ok = 0; again = 0;
		goto end_idle
	}
}

proctype client(byte c)
{
	byte t, a;
	bit ser;

	do
	:: t < (CMDOF(c) == 1 -> MAXTRY : REUSETRY) ->
		/* a call: the first, or a retry of an answer that is not final,
		 * on any node */
		atomic {
			t++; tag[c] = t; ans[c] = A_NONE;
#ifdef RAW_BODY_HASH
			if :: ser = 0 :: ser = 1 fi;   /* re-serialised: field order, "10.0" */
#endif
		};
		if
		:: req[0] ! c, t, ser
		:: req[1] ! c, t, ser
		fi;
		atomic {
			if
			:: ans[c] != A_NONE -> a = ans[c]; ans[c] = A_NONE
			:: FAULT && ans[c] == A_NONE -> faults++; a = A_LOST   /* gives up waiting */
			fi;
			if
			:: FINAL(a) -> break
			:: else -> a = A_NONE
			fi
		}
	:: else -> break
	od;
	atomic { tag[c] = 0; t = 0; a = 0; ser = 0 }
}

active proctype clock()
{
end:
	do
	:: atomic {
		/* locked_until passes: at once for an owner that is gone, as a
		 * fault (a pause) for one still working */
		locked && OPEN(st) && (own[owner] != tok || FAULT) ->
			if :: own[owner] == tok -> faults++ :: else -> skip fi;
			locked = 0
	   }
	:: atomic {
		/* a lock's lease ends in etcd: its node died, or (a fault) it
		 * is paused past its local deadline */
		lk != 0 && (own[lk - 1] != lktok || FAULT) ->
			if :: own[lk - 1] == lktok -> faults++ :: else -> skip fi;
			lk = 0
	   }
	:: atomic {
		/* the replay window ends */
		SETTLED(st) && !expired && nexp < MAXEXP -> expired = 1; nexp++
	   }
#ifdef LIVENESS
	:: else ->
		/* time goes on when nothing else happens, so that a run that
		 * ends is an infinite one to the liveness check (weak fairness
		 * ignores runs that stop) */
		skip
#endif
	od
}

init
{
	byte i;
	atomic {
		for (i : 0 .. NN - 1) { run node(i) }
		for (i : 0 .. NC - 1) { run client(i) }
	}
}

/* No key is stuck once faults stop: the record ends neither IN_PROGRESS
 * nor UNKNOWN_REQUIRES_RECOVERY (checked with -a -f, weak fairness). */
ltl settled { <>[] !(st == INPROG || st == UNK) }
