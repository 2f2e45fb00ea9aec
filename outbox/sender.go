package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/store"
)

// SendLease is how long SendBatch holds its claim on an email while sending
// it. Another sender may take (and send again) an email whose claim expired
// without sent_at being recorded. Each Mailer.Send call is given at most
// half of it.
const SendLease = time.Minute

// markTimeout bounds recording a batch's results, which goes on even when the
// caller's context is cancelled after the emails were handed to the mailer.
const markTimeout = 10 * time.Second

// Email is a message for a Mailer.
type Email struct {
	// DedupeKey identifies the email ("receipt_payment_<paymentId>"). It is
	// the same on every attempt: a mail provider that deduplicates on it
	// turns at-least-once sending into exactly-once.
	DedupeKey string
	// Tenant is the tenant of the payment.
	Tenant string
	// To is the recipient. The reference domain has no addresses: it is the
	// payment's account id.
	To string
	// Subject and Body are the email's text.
	Subject string
	Body    string
	// Attempt is which claim of the email this is: 1 the first; above 1,
	// an earlier attempt may have gone out.
	Attempt int
}

// Mailer sends an email: an external side effect that no transaction can
// roll back. A nil error means the email was accepted.
type Mailer interface {
	Send(ctx context.Context, e Email) error
}

// SentLookup is what a Mailer implements when its mail system can say
// whether an email it was handed has gone out, by the email's DedupeKey. A
// send whose answer was lost (the connection dropped after the mail system
// took the email) is then not sent again: before it sends an email a
// previous attempt may have sent (Email.Attempt above 1), the Sender asks,
// and records an email the mail system has as sent, as the payments flow
// asks its provider before it charges again. Without it, sending is
// at-least-once.
type SentLookup interface {
	Sent(ctx context.Context, dedupeKey string) (bool, error)
}

// SinkMailer is a Mailer that stands for an external mail system: each Send
// writes one row into sent_emails, in its own statement outside any
// transaction of the caller's. sent_emails has no unique constraint, so an
// email sent twice shows as two rows.
type SinkMailer struct {
	st *store.Store
}

// Sent implements SentLookup: whether sent_emails has a row of dedupeKey.
func (m *SinkMailer) Sent(ctx context.Context, dedupeKey string) (bool, error) {
	var sent bool
	if err := m.st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sent_emails WHERE dedupe_key = $1)`, dedupeKey).Scan(&sent); err != nil {
		return false, fmt.Errorf("outbox: sink mailer: look up %s: %w", dedupeKey, err)
	}
	return sent, nil
}

// NewSinkMailer returns a SinkMailer writing into st's sent_emails.
func NewSinkMailer(st *store.Store) *SinkMailer { return &SinkMailer{st: st} }

// Send implements Mailer.
func (m *SinkMailer) Send(ctx context.Context, e Email) error {
	if _, err := m.st.Pool().Exec(ctx, `INSERT INTO sent_emails (dedupe_key, tenant_id, recipient, subject, body, sent_at)
		VALUES ($1, $2, $3, $4, $5, now())`, e.DedupeKey, e.Tenant, e.To, e.Subject, e.Body); err != nil {
		return fmt.Errorf("outbox: sink mailer: %w", err)
	}
	return nil
}

// Sender sends the persisted email notifications. Any number of Senders may
// run at once, on any nodes. It is safe for concurrent use.
type Sender struct {
	st     *store.Store
	mailer Mailer
}

// NewSender returns a Sender that sends through m; a nil m means
// NewSinkMailer(st).
func NewSender(st *store.Store, m Mailer) *Sender {
	if m == nil {
		m = NewSinkMailer(st)
	}
	return &Sender{st: st, mailer: m}
}

// SendBatch sends up to limit of the oldest unsent email notifications and
// returns how many the mailer accepted. It works in three steps:
//
//  1. one transaction claims unsent, unclaimed rows (FOR UPDATE SKIP LOCKED)
//     for SendLease and counts the attempt, and commits;
//  2. the mailer is called for each claimed row, outside any transaction;
//  3. one transaction sets sent_at on the accepted emails, and releases the
//     claim (recording last_error) of the others, which a later batch
//     retries.
//
// The mailer is never called inside a transaction because the store retries
// transactions after serialization failures, which would send again. The
// claim keeps concurrent senders from sending the same email. A mailer's
// answer can be lost (a crash or a store outage between a send and step 3,
// a send that outlives SendLease, a connection that drops after the mail
// system took the email), and the email is then claimed again later: with a
// mailer that implements SentLookup (SinkMailer does), an email on its
// second or later attempt is looked up first, and one the mail system has
// is only recorded as sent, so each email goes out once; with any other
// mailer, sending is at-least-once (see the package documentation). When ctx ends during step 2, the send under way
// finishes (cut short, it may have gone out anyway, and would be released
// and sent again), the others are released unattempted, and step 3 runs.
// A non-nil error with a positive count means some emails were sent and
// others failed; the error joins the failures.
func (s *Sender) SendBatch(ctx context.Context, limit int) (int, error) {
	if limit < 1 {
		return 0, fmt.Errorf("outbox: send: %w", errInvalidLimit)
	}
	claimed, err := s.claim(ctx, limit)
	if err != nil || len(claimed) == 0 {
		return 0, err
	}
	var (
		sent     []string
		released []string
		reasons  []string
		failures []error
		skipped  int
	)
	for _, e := range claimed {
		if ctx.Err() != nil {
			released, reasons = append(released, e.DedupeKey), append(reasons, "not attempted: "+ctx.Err().Error())
			skipped++
			continue
		}
		// A send once begun is not cut short when ctx ends (a node
		// shutting down): cancelled mid-way it may still have gone out,
		// and its release below would let another sender send it again
		// at once. Only its own bound ends it.
		sendCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SendLease/2)
		err := s.send(sendCtx, e)
		cancel()
		if err != nil {
			released, reasons = append(released, e.DedupeKey), append(reasons, err.Error())
			failures = append(failures, fmt.Errorf("outbox: send %s: %w", e.DedupeKey, err))
			continue
		}
		sent = append(sent, e.DedupeKey)
	}
	markCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	err = s.st.ExecTxReadCommitted(markCtx, func(tx pgx.Tx) error {
		if len(sent) > 0 {
			if _, err := tx.Exec(markCtx, `UPDATE email_notifications
				SET sent_at = now(), claimed_until = NULL, last_error = NULL
				WHERE dedupe_key = ANY ($1::TEXT[]) AND sent_at IS NULL`, sent); err != nil {
				return err
			}
		}
		if len(released) > 0 {
			if _, err := tx.Exec(markCtx, `UPDATE email_notifications AS n
				SET claimed_until = NULL, last_error = f.reason
				FROM unnest($1::TEXT[], $2::TEXT[]) AS f (dedupe_key, reason)
				WHERE n.dedupe_key = f.dedupe_key AND n.sent_at IS NULL`, released, reasons); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		failures = append(failures, fmt.Errorf("outbox: record %d sent emails (they will be sent again after the lease): %w", len(sent), err))
	}
	if skipped > 0 {
		failures = append(failures, fmt.Errorf("outbox: send: %d claimed emails not attempted: %w", skipped, ctx.Err()))
	}
	return len(sent), errors.Join(failures...)
}

// send hands e to the mailer, unless an earlier attempt may have sent it
// and the mailer's SentLookup says it did.
func (s *Sender) send(ctx context.Context, e Email) error {
	if lookup, ok := s.mailer.(SentLookup); ok && e.Attempt > 1 {
		sent, err := lookup.Sent(ctx, e.DedupeKey)
		if err != nil || sent {
			return err
		}
	}
	return s.mailer.Send(ctx, e)
}

// claim takes up to limit unsent emails whose claim is free or expired.
func (s *Sender) claim(ctx context.Context, limit int) ([]Email, error) {
	var claimed []Email
	err := s.st.ExecTxReadCommitted(ctx, func(tx pgx.Tx) error {
		claimed = nil
		rows, err := tx.Query(ctx, `SELECT dedupe_key, tenant_id, payment_id, account_id, amount, currency, attempts + 1
			FROM email_notifications
			WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until <= now())
			ORDER BY created_at
			LIMIT $1
			FOR UPDATE SKIP LOCKED`, limit)
		if err != nil {
			return err
		}
		emails, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Email, error) {
			var e Email
			var paymentID, amount, currency string
			if err := row.Scan(&e.DedupeKey, &e.Tenant, &paymentID, &e.To, &amount, &currency, &e.Attempt); err != nil {
				return e, err
			}
			e.Subject = "Receipt for payment " + paymentID
			e.Body = fmt.Sprintf("Payment %s of %s %s from account %s is confirmed.", paymentID, amount, currency, e.To)
			return e, nil
		})
		if err != nil || len(emails) == 0 {
			return err
		}
		keys := make([]string, len(emails))
		for i, e := range emails {
			keys[i] = e.DedupeKey
		}
		if _, err := tx.Exec(ctx, `UPDATE email_notifications
			SET claimed_until = now() + $2::INT8 * INTERVAL '1 millisecond', attempts = attempts + 1
			WHERE dedupe_key = ANY ($1::TEXT[])`, keys, SendLease.Milliseconds()); err != nil {
			return err
		}
		claimed = emails
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim emails: %w", err)
	}
	return claimed, nil
}
