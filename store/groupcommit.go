package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/idemcoord/idem"
)

// maxGroup bounds how many completions one statement carries.
const maxGroup = 32

// completions is the group commit of Complete: the completions of
// concurrent requests that queue while one batch is in flight go to the
// store together, in one fenced UPDATE that is one implicit transaction,
// so that N owners pay one statement and one commit instead of N. There
// is no added wait: a batch is what queued while the previous one was in
// flight, and a completion with nothing in flight goes at once, alone.
// The caller whose completion heads the queue runs the next batch (no
// goroutine of its own), and hands the queue on when its batch is done.
type completions struct {
	mu    sync.Mutex
	queue []*pendingCompletion
	busy  bool
}

type pendingCompletion struct {
	lease idem.Lease
	cols  storedResponse
	c     idem.Completion
	// done receives the completion's outcome: nil, idem.ErrFenced or the
	// batch's error. lead is closed when this caller is to run the next
	// batch.
	done chan error
	lead chan struct{}
}

// complete writes c under lease as part of a batch and returns its
// outcome: nil (written), idem.ErrFenced (lease no longer owns an open
// record), or the batch's error, which may be ErrCommitUnknown (the caller
// resolves that record by record, see fencedWrite).
func (g *completions) complete(ctx context.Context, s *Store, lease idem.Lease, c idem.Completion) error {
	cols, err := responseColumns(&c.Response)
	if err != nil {
		return err
	}
	p := &pendingCompletion{lease: lease, cols: cols, c: c, done: make(chan error, 1), lead: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, p)
	if !g.busy {
		g.busy = true
		close(p.lead)
	}
	g.mu.Unlock()
	for {
		select {
		case err := <-p.done:
			return err
		case <-p.lead:
			g.runBatch(ctx, s)
			p.lead = nil // led once; the batch held p, whose outcome is in done
		}
	}
}

// runBatch takes the head of the queue (at most maxGroup completions, no
// two of one scope), writes it, delivers each outcome, and hands the queue
// to the next waiting caller, or marks the group idle.
func (g *completions) runBatch(ctx context.Context, s *Store) {
	g.mu.Lock()
	var batch, rest []*pendingCompletion
	seen := map[idem.Scope]bool{}
	for _, p := range g.queue {
		if len(batch) < maxGroup && !seen[p.lease.Scope] {
			seen[p.lease.Scope] = true
			batch = append(batch, p)
			continue
		}
		rest = append(rest, p)
	}
	g.queue = rest
	g.mu.Unlock()

	written, err := s.completeBatch(ctx, batch)
	for _, p := range batch {
		switch {
		case err != nil:
			p.done <- err
		case written[p.lease.Scope]:
			p.done <- nil
		default:
			p.done <- idem.ErrFenced
		}
	}

	g.mu.Lock()
	if len(g.queue) > 0 {
		close(g.queue[0].lead)
	} else {
		g.busy = false
	}
	g.mu.Unlock()
}

// completeBatch writes batch in one statement and reports which scopes it
// wrote (the others' leases no longer own an open record).
func (s *Store) completeBatch(ctx context.Context, batch []*pendingCompletion) (map[idem.Scope]bool, error) {
	args := make([]any, 0, len(batch)*completionColumns)
	for _, p := range batch {
		args = append(args, p.lease.Tenant, p.lease.Operation, p.lease.Key, p.lease.Token,
			p.cols.status, p.cols.headers, p.cols.body, p.cols.schema, p.cols.byReference,
			nullable(p.c.ResourceType), nullable(p.c.ResourceID))
	}
	var written map[idem.Scope]bool
	err := s.ExecOne(ctx, func(q Querier) error {
		written = map[idem.Scope]bool{}
		rows, err := q.Query(ctx, completeBatchSQL(len(batch)), args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var sc idem.Scope
			if err := rows.Scan(&sc.Tenant, &sc.Operation, &sc.Key); err != nil {
				return err
			}
			written[sc] = true
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return written, nil
}

// completionColumns is how many parameters one completion of a batch
// takes.
const completionColumns = 11

var batchSQL sync.Map // int -> string

// completeBatchSQL is CompleteTx's fenced update for n records at once.
func completeBatchSQL(n int) string {
	if q, ok := batchSQL.Load(n); ok {
		return q.(string)
	}
	var values strings.Builder
	for i := range n {
		if i > 0 {
			values.WriteString(", ")
		}
		p := func(j int) string { return "$" + strconv.Itoa(i*completionColumns+j) }
		fmt.Fprintf(&values, "(%s::TEXT, %s::TEXT, %s::TEXT, %s::INT8, %s::INT4, %s::JSONB, %s::BYTEA, %s::TEXT, %s::BOOL, %s::TEXT, %s::TEXT)",
			p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9), p(10), p(11))
	}
	q := `UPDATE idempotency_records AS r SET updated_at = now(), status = 'COMPLETED', checkpoint = 'COMPLETED', locked_until = NULL,
		response_status = v.rs, response_headers = v.rh, response_body = v.rb, response_schema_version = v.sv,
		response_by_reference = v.br, resource_type = v.rt, resource_id = v.ri, error_code = NULL
	FROM (VALUES ` + values.String() + `) AS v(t, o, k, tok, rs, rh, rb, sv, br, rt, ri)
	WHERE r.tenant_id = v.t AND r.operation_name = v.o AND r.idempotency_key = v.k AND r.fencing_token = v.tok
		AND (r.status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY')) IS TRUE
	RETURNING r.tenant_id, r.operation_name, r.idempotency_key`
	batchSQL.Store(n, q)
	return q
}
