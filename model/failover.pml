/*
 * failover.pml: a tenant's region failover in region-local mode, checked
 * with SPIN. docs/model.md maps every step to the code that implements it.
 *
 *   regions  A (the tenant's home) and B, one node each, each with its own
 *            store (records, the payment row, outbox events).
 *   etcd     the placement (home, whose changes raise the epoch), A's
 *            region lease, each node's watched copy of the placement.
 *   A's lease  A's node serves only while its local deadline has not passed;
 *            the deadline passes (A cut off, keepalives failing) before
 *            etcd expires the lease; a failover writes the new placement
 *            only once the lease has expired in etcd; a node that rejoins
 *            serves only once its map has caught up.
 *   clients  c0 sends a payment under key k0; c1 sends the same payment (the
 *            same business identity) under a fresh key k1, as a client
 *            without stable keys does. Both retry, in any region, until a
 *            final answer; a node that is not home forwards once.
 *   provider deduplicates by a provider key derived from the payment's
 *            business identity, and keeps the reference of the key that
 *            charged; the new home asks it before it charges a key it has
 *            no record of (the uncertainty window).
 *   effects  each region publishes its outbox and its consumer produces
 *            the receipt only if it claims the effect first in a database
 *            every region sees (outbox.EffectGuard).
 *   handover once A is reachable again: A's records and payment row are
 *            merged into B's store (never overwriting), then marked.
 *
 * Faults: A is cut off once (from clients, B, etcd and the provider; its
 * own store stays reachable), and may or may not come back.
 *
 * Broken variants (each must be refuted): -DEARLY_FAILOVER,
 * -DNO_LOCAL_DEADLINE, -DNO_CATCHUP, -DKEY_DERIVED_ID (bug 2 of
 * docs/chaos.md), -DREGIONAL_EFFECTS (bug 3), -DFAILOVER_GIVES_UP (bug 5,
 * a liveness bug: check it with -a -f).
 */

#define RA 0
#define RB 1
#define NK 2        /* k0, k1 */
#define NC 2        /* client c uses key c */
#ifndef C1TRY
#define C1TRY 3     /* calls c1 makes at most (c0 retries until it is answered) */
#endif
#ifndef NCL
#define NCL 2       /* clients started: c0, then c1 */
#endif

/* record states */
#define NONE   0
#define INPROG 1
#define DONE   2    /* COMPLETED (201) */
#define DUPREC 3    /* FAILED_REPLAYABLE 409 DUPLICATE_MERCHANT_REFERENCE */
#define OPEN(s) ((s) == INPROG)

/* answers */
#define A_NONE    0
#define A_LOST    1   /* connection failed: the region is cut off */
#define A_NOTHOME 2   /* 503 TENANT_NOT_SERVED_HERE / home unreachable */
#define A_FWDA    3   /* forward to A (the client side of a proxied hop) */
#define A_FWDB    4   /* forward to B */
#define A_OK      16  /* 201: A_OK + charge */
#define A_DUP     32  /* 409 DUPLICATE_MERCHANT_REFERENCE: A_DUP + charge */
#define FINAL(a) ((a) >= A_OK)

/* provider keys: derived from the business identity (one payment), or,
 * broken, from the idempotency key */
#ifdef KEY_DERIVED_ID
#define PK(k) (k)
#else
#define PK(k) 0
#endif
#define NPK 2

/* ---------------- etcd ---------------- */
byte home = RA;        /* effective placement */
bit  leaseA = 1;       /* A's region lease exists in etcd */
bit  gaveup;           /* the failover gave up (broken variant) */
byte vhome[2];         /* each node's watched map: home (RA initially) */

/* ---------------- region A ---------------- */
bit  cutA;             /* cut off */
bit  cuts;             /* A was cut off once: connections of before are gone */
bit  parted;           /* the partition happened */
bit  willheal;         /* ... and it will heal */
bit  validA = 1;       /* A's lease is within its local deadline */
bit  caughtA = 1;      /* A's map has caught up with its registration */

/* ---------------- stores ---------------- */
byte rst[2 * NK];      /* record status, [region * NK + key] */
byte rans[2 * NK];     /* stored answer */
bit  payrow[2];        /* the payment row (derived id) exists in the store */
byte payby[2];         /* key + 1 whose claim wrote it */
bit  evt[2];           /* its PaymentConfirmed event is in the outbox */
bit  consumed[2];      /* ... and was consumed */
bit  handed;           /* A's records were handed over to B */

/* ---------------- provider, effects ---------------- */
bit  pch[NPK];         /* charged */
byte pref[NPK];        /* key + 1 whose reference the charge carries */
byte gclaim;           /* effect claim: region + 1 */
byte emails;           /* receipts produced (ghost) */

/* ---------------- network ---------------- */
chan req[2] = [1] of { byte, byte, bit, bit };   /* client, key, hops, cuts */
byte waiting[NC];      /* region + 1 the client waits on */
byte ans[NC];
bit  fin[NC];          /* the client has its final answer */

/* ---------------- ghosts ---------------- */
byte charges;          /* charges of the one business payment */
byte ack[NK];          /* the final answer a key got */

#define VALID(r) ((r) == RB || validA)
#define CAUGHT(r) ((r) == RB || caughtA)
/* a node admits the tenant's requests as home (routing.Router.Route) */
#define SERVES(r) (vhome[r] == (r) && VALID(r) && CAUGHT(r))
#define REACH(r) ((r) == RB || !cutA)
#define R(r, k) ((r) * NK + (k))

/* Home lease, not just a map: at no moment do two regions admit the
 * tenant as home. */
active proctype monitor()
{
end:	atomic { (SERVES(RA) && SERVES(RB)) -> assert(false) }
}

/* The answer reaches the client only over the connection it came on: not
 * across a partition that cut it. Then the node is idle again. */
inline reply()
{
	if
	:: waiting[c] == r + 1 && mycuts == cuts && REACH(r) ->
		if
		:: FINAL(a) ->
			/* Replay is a contract: one final answer per key, in
			 * every region */
			assert(ack[k] == 0 || ack[k] == a); ack[k] = a
		:: else -> skip
		fi;
		ans[c] = a
	:: else -> skip
	fi;
	c = 0; k = 0; pk = 0; a = 0; mycuts = 0; hop = 0; uncertain = 0;
	goto end_idle
}

proctype node(byte r)
{
	byte c, k, pk, a;
	bit hop, uncertain, mycuts;

end_idle:
	atomic {
		req[r] ? c, k, hop, mycuts;
		/* a request sent before a partition cut its connection is gone */
		if :: mycuts != cuts -> reply() :: else -> skip fi;
		/* region.Server.routed: serve as home, forward once, or refuse */
		if
		:: SERVES(r) -> skip
		:: !SERVES(r) && !hop && vhome[r] != r ->
			a = (vhome[r] == RA -> A_FWDA : A_FWDB); reply()
		:: else -> a = A_NOTHOME; reply()
		fi;
		/* Route.Uncertain: moved here, not handed over yet */
		uncertain = (r == RB && home == RB && !handed);
		pk = PK(k);
		/* the claim (payments' ClaimWithPayment, or a decision on the
		 * record) */
		if
		:: rst[R(r, k)] == DONE || rst[R(r, k)] == DUPREC -> a = rans[R(r, k)]; reply()
		:: rst[R(r, k)] == INPROG -> skip          /* stale (handed over): take over */
		:: rst[R(r, k)] == NONE && payrow[r] && payby[r] != k + 1 ->
			/* unique(tenant, account, merchant reference): another
			 * key's claim wrote the payment here (rejectDuplicate) */
			if
			:: uncertain -> goto end_dupcheck
			:: else -> rst[R(r, k)] = DUPREC; a = A_DUP + pk + 1; rans[R(r, k)] = a; reply()
			fi
		:: rst[R(r, k)] == NONE && !(payrow[r] && payby[r] != k + 1) ->
			rst[R(r, k)] = INPROG;
			if :: !payrow[r] -> payrow[r] = 1; payby[r] = k + 1 :: else -> skip fi;
			if
			:: !uncertain -> goto end_charge
			:: else -> skip   /* a key the old home may have run: ask first */
			fi
		fi
	};
	/* provider.Client.Lookup by the derived provider key (a node cut
	 * off waits here, and at the charge, as long as the cut lasts) */
end_lookup:
	atomic {
		REACH(r) ->
		if
		:: pch[pk] -> goto confirm
		:: else -> skip
		fi
	};
end_charge:
	/* provider.Client.Charge with the derived provider key */
	atomic {
		REACH(r) ->
		if
		:: !pch[pk] -> pch[pk] = 1; pref[pk] = k + 1;
			/* single-charge: one business payment, one charge */
			charges++; assert(charges <= 1)
		:: else -> skip
		fi
	};
confirm:
	/* the result, the payment's status and its PaymentConfirmed event
	 * commit together (payments.confirm, chargedForAnotherKey) */
	atomic {
		if
		:: pref[pk] == k + 1 -> rst[R(r, k)] = DONE; a = A_OK + pk + 1
		:: else -> rst[R(r, k)] = DUPREC; a = A_DUP + pk + 1
		fi;
		rans[R(r, k)] = a;
		if :: !payrow[r] -> payrow[r] = 1; payby[r] = k + 1 :: else -> skip fi;
		evt[r] = 1;
		reply()
	};
end_dupcheck:
	/* in the uncertainty window the charge's reference tells whether this
	 * key made the payment in the old home (answered as its creator) or
	 * another key did (409 DUPLICATE_MERCHANT_REFERENCE) */
	atomic {
		REACH(r) ->
		if
		:: pch[pk] && pref[pk] == k + 1 -> rst[R(r, k)] = DONE; a = A_OK + pk + 1
		:: else -> rst[R(r, k)] = DUPREC; a = A_DUP + pk + 1
		fi;
		rans[R(r, k)] = a;
		reply()
	}
}

proctype client(byte c)
{
	byte r, a, n;
	bit hop, sent;

	if :: r = RA :: r = RB fi;   /* the first call goes to any region */
	do
	:: fin[c] || (c == 1 && n == C1TRY) -> break
	:: !fin[c] && (c == 0 || n < C1TRY) ->
		if :: c == 1 -> n++ :: else -> skip fi;
		/* a call; a retry goes to the other region (the chaos harness's
		 * clients do the same) */
		if
		:: atomic { !REACH(r) -> a = A_LOST }   /* A is cut off */
		:: atomic { REACH(r) && nfull(req[r]) -> waiting[c] = r + 1; sent = cuts; req[r] ! c, c, 0, cuts }
		fi;
call:
		atomic {
			if
			:: a == A_LOST -> skip
			:: ans[c] != A_NONE -> a = ans[c]; ans[c] = A_NONE
			:: a != A_LOST && sent != cuts -> a = A_LOST   /* cut off mid-call */
			fi;
			waiting[c] = 0;
			if
			:: (a == A_FWDA || a == A_FWDB) && !hop ->
				/* the node forwards once (region.Server.routed) */
				hop = 1; a = A_NONE;
				if
				:: !REACH(1 - r) -> a = A_LOST
				:: REACH(1 - r) && nfull(req[1 - r]) -> waiting[c] = 2 - r; sent = cuts; req[1 - r] ! c, c, 1, cuts
				fi;
				goto call
			:: FINAL(a) -> fin[c] = 1
			:: else -> skip
			fi;
			a = A_NONE; hop = 0; sent = 0; r = 1 - r
		}
	od
}

/* etcd, the clock, the failover, the handover, the outbox consumers */
active proctype world()
{
	byte k;
end:
	do
	:: atomic {
		/* A is cut off (once); whether it comes back is decided now */
		!parted -> parted = 1; cutA = 1; cuts = 1;
		if :: willheal = 1 :: willheal = 0 fi
	   }
#ifdef NO_LOCAL_DEADLINE
	/* broken: A's deadline is not ahead of etcd's expiry (measured from
	 * the keepalive's answer, or without a margin for clock rate): the
	 * two happen in either order */
	:: atomic { cutA && validA -> validA = 0 }
	:: atomic { cutA && leaseA -> leaseA = 0 }
#else
	:: atomic {
		/* A's local deadline passes (last keepalive sent + TTL -
		 * margin), and etcd expires the lease no earlier */
		cutA && validA -> validA = 0; leaseA = 0
	   }
#endif
	:: atomic {
		/* routing.MoveRegion: one conditional write, only once A has
		 * no live lease */
#ifdef EARLY_FAILOVER
		home == RA && !gaveup && cutA -> home = RB; vhome[RB] = RB
#else
		home == RA && !gaveup && !leaseA -> home = RB; vhome[RB] = RB
#endif
	   }
#ifdef FAILOVER_GIVES_UP
	:: atomic {
		/* failover.Move returns etcd's transient error instead of
		 * trying again */
		home == RA && !gaveup && !leaseA -> gaveup = 1
	   }
#endif
	:: atomic {
		/* A comes back: a dead lease is never revived, the node
		 * grants a new one and serves once its map has caught up */
		cutA && willheal -> cutA = 0;
		if
		:: !validA || !leaseA -> validA = 1; leaseA = 1;
#ifdef NO_CATCHUP
			caughtA = 1
#else
			caughtA = 0
#endif
		:: else -> skip
		fi
	   }
	:: atomic {
		/* A's watch (routing.Map), while A reaches etcd */
		!cutA && (vhome[RA] != home || !caughtA) -> vhome[RA] = home; caughtA = 1
	   }
	:: atomic {
		/* failover.Handover: A's records and payment merged into B's
		 * store (nothing overwritten), then the handover mark */
		home == RB && !cutA && !handed ->
		for (k : 0 .. NK - 1) {
			if
			:: rst[R(RB, k)] == NONE && rst[R(RA, k)] != NONE ->
				rst[R(RB, k)] = rst[R(RA, k)]; rans[R(RB, k)] = rans[R(RA, k)]
			:: else -> skip
			fi
		}
		if :: !payrow[RB] && payrow[RA] -> payrow[RB] = 1; payby[RB] = payby[RA] :: else -> skip fi;
		handed = 1
	   }
	:: atomic {
		/* each region's outbox consumer: the receipt is produced by the
		 * region that claims it first (outbox.EffectGuard) */
		evt[RA] && !consumed[RA] && !cutA ->
		consumed[RA] = 1;
		if :: gclaim == 0 -> gclaim = RA + 1 :: else -> skip fi;
#ifdef REGIONAL_EFFECTS
		emails++;
#else
		if :: gclaim == RA + 1 -> emails++ :: else -> skip fi;
#endif
		assert(emails <= 1)   /* single-email */
	   }
	:: atomic {
		evt[RB] && !consumed[RB] ->
		consumed[RB] = 1;
		if :: gclaim == 0 -> gclaim = RB + 1 :: else -> skip fi;
#ifdef REGIONAL_EFFECTS
		emails++;
#else
		if :: gclaim == RB + 1 -> emails++ :: else -> skip fi;
#endif
		assert(emails <= 1)
	   }
#ifdef LIVENESS
	:: else -> skip   /* time goes on (see single_key.pml) */
#endif
	od
}

init
{
	atomic {
		run node(RA); run node(RB);
		run client(0);
		if :: NCL > 1 -> run client(1) :: else -> skip fi
	}
}

/* No key is stuck once faults stop: a client that keeps retrying (c0)
 * gets its final answer, whether A comes back or not (-a -f). */
ltl answered { <> fin[0] }
