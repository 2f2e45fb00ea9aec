package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/routing"
)

// dbRecord is an idempotency record as the checks see it.
type dbRecord struct {
	Store      string    `json:"store"`
	Tenant     string    `json:"tenant"`
	Key        string    `json:"key"`
	Status     string    `json:"status"`
	Checkpoint string    `json:"checkpoint"`
	Generation int       `json:"generation"`
	Resource   string    `json:"resource,omitempty"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// dbPayment is a payment row.
type dbPayment struct {
	Store       string    `json:"store"`
	Tenant      string    `json:"tenant"`
	ID          string    `json:"paymentId"`
	Account     string    `json:"account"`
	AmountMinor int64     `json:"amountMinor"`
	Currency    string    `json:"currency"`
	Reference   string    `json:"merchantReference"`
	Status      string    `json:"status"`
	ProviderKey string    `json:"providerKey"`
	Channel     string    `json:"channel"`
	CreatedAt   time.Time `json:"createdAt"`
}

// dbState is what every store holds of a run once it has quiesced.
type dbState struct {
	Records  []dbRecord
	Payments []dbPayment
	// Ledger counts ledger entries by store, entry type and payment.
	Ledger map[[3]string]int
	// Notifications counts email notification rows by store and payment;
	// Sent counts sent emails by dedupe key (over every store).
	Notifications map[[2]string]int
	Sent          map[string]int
	SentByStore   map[[2]string]int
	// Backlog counts open work per store: unpublished outbox events,
	// unprocessed queue messages, unsent emails nobody is sending.
	Backlog map[string][3]int
	// Leased counts unsent emails per store under a sender's claim
	// (outbox.SendLease): a sender that lost the store mid-send cannot
	// release its claim, so they wait for the lease to run out.
	Leased map[string]int
}

// clusterView is what the state reads need of a cluster: its description
// (as cluster.json holds it) and its etcd client (nil without etcd). A
// cluster the harness started and one a drill attached to alike.
type clusterView struct {
	info cluster.Info
	etcd *clientv3.Client
	// skip names the stores that are gone (a region lost with its
	// store): they are not read.
	skip map[string]bool
}

func viewOf(c *cluster.Cluster) clusterView { return clusterView{info: c.Info(), etcd: c.EtcdClient()} }

// storeURLs returns each distinct store of c: name (the region, or
// "global") -> database URL, as the cluster itself reaches it.
func storeURLs(c clusterView) map[string]string {
	out := map[string]string{}
	seen := map[string]bool{}
	for _, r := range c.info.Regions {
		if seen[r.DatabaseURL] {
			continue
		}
		seen[r.DatabaseURL] = true
		name := r.Name
		if c.info.StoreMode == cluster.StoreGlobal {
			name = "global"
		}
		if c.skip[name] {
			continue
		}
		out[name] = r.DatabaseURL
	}
	return out
}

// homeStores returns, for each tenant, the name of the store its home
// region uses now (after any failover).
func homeStores(ctx context.Context, c clusterView) (map[string]string, error) {
	out := map[string]string{}
	for tenant := range c.info.Tokens {
		if c.info.StoreMode == cluster.StoreGlobal {
			out[tenant] = "global"
			continue
		}
		if c.etcd == nil {
			out[tenant] = "" // every region serves every tenant
			continue
		}
		p, ok, err := routing.GetPlacement(ctx, c.etcd, tenant)
		if err != nil {
			return nil, fmt.Errorf("chaos: placement of %s: %w", tenant, err)
		}
		if ok {
			out[tenant] = p.Region
		}
	}
	return out, nil
}

// readState reads the run's rows (keys and merchant references starting
// with prefix) from every store.
func readState(ctx context.Context, stores map[string]string, prefix string) (*dbState, error) {
	st := &dbState{
		Ledger: map[[3]string]int{}, Notifications: map[[2]string]int{}, Sent: map[string]int{},
		SentByStore: map[[2]string]int{}, Backlog: map[string][3]int{}, Leased: map[string]int{},
	}
	names := make([]string, 0, len(stores))
	for n := range stores {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := st.read(ctx, name, stores[name], prefix); err != nil {
			return nil, fmt.Errorf("chaos: read store %s: %w", name, err)
		}
	}
	return st, nil
}

func (st *dbState) read(ctx context.Context, name, url, prefix string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// One read-only snapshot for every query: the counts agree with each
	// other, and a read-only REPEATABLE READ transaction never fails with a
	// serialization error (the store's default is SERIALIZABLE, where even a
	// reader can be chosen as the victim while nodes still write). Closing
	// the connection ends it.
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return err
	}
	like := escapeLike(prefix) + "%"
	rows, err := conn.Query(ctx, `SELECT tenant_id, idempotency_key, status, checkpoint, generation, COALESCE(resource_id, ''), updated_at
		FROM idempotency_records WHERE idempotency_key LIKE $1`, like)
	if err != nil {
		return err
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dbRecord, error) {
		d := dbRecord{Store: name}
		err := r.Scan(&d.Tenant, &d.Key, &d.Status, &d.Checkpoint, &d.Generation, &d.Resource, &d.UpdatedAt)
		return d, err
	})
	if err != nil {
		return err
	}
	st.Records = append(st.Records, recs...)
	rows, err = conn.Query(ctx, `SELECT tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference, status, provider_key, channel, created_at
		FROM payments WHERE merchant_reference LIKE $1`, like)
	if err != nil {
		return err
	}
	pays, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dbPayment, error) {
		p := dbPayment{Store: name}
		err := r.Scan(&p.Tenant, &p.ID, &p.Account, &p.AmountMinor, &p.Currency, &p.Reference, &p.Status, &p.ProviderKey, &p.Channel, &p.CreatedAt)
		return p, err
	})
	if err != nil {
		return err
	}
	st.Payments = append(st.Payments, pays...)
	// Effects of every payment of the run (in this store or another one).
	ids := make([]string, 0, len(pays))
	for _, p := range st.Payments {
		ids = append(ids, p.ID)
	}
	rows, err = conn.Query(ctx, `SELECT entry_type, source_payment_id, count(*) FROM ledger_entries
		WHERE source_payment_id IN (SELECT payment_id FROM payments WHERE merchant_reference LIKE $1) OR source_payment_id = ANY($2)
		GROUP BY 1, 2`, like, ids)
	if err != nil {
		return err
	}
	var typ, pid string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&typ, &pid, &n}, func() error {
		st.Ledger[[3]string{name, typ, pid}] += n
		return nil
	}); err != nil {
		return err
	}
	rows, err = conn.Query(ctx, `SELECT payment_id, count(*) FROM email_notifications
		WHERE payment_id IN (SELECT payment_id FROM payments WHERE merchant_reference LIKE $1) OR payment_id = ANY($2) GROUP BY 1`, like, ids)
	if err != nil {
		return err
	}
	if _, err := pgx.ForEachRow(rows, []any{&pid, &n}, func() error {
		st.Notifications[[2]string{name, pid}] += n
		return nil
	}); err != nil {
		return err
	}
	rows, err = conn.Query(ctx, `SELECT s.dedupe_key, count(*) FROM sent_emails s JOIN email_notifications e ON e.dedupe_key = s.dedupe_key
		WHERE e.payment_id IN (SELECT payment_id FROM payments WHERE merchant_reference LIKE $1) OR e.payment_id = ANY($2) GROUP BY 1`, like, ids)
	if err != nil {
		return err
	}
	var dk string
	if _, err := pgx.ForEachRow(rows, []any{&dk, &n}, func() error {
		st.Sent[dk] += n
		st.SentByStore[[2]string{name, dk}] += n
		return nil
	}); err != nil {
		return err
	}
	var b [3]int
	var leased int
	if err := conn.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM outbox_events WHERE published_at IS NULL),
		(SELECT count(*) FROM queue_messages WHERE processed_at IS NULL),
		(SELECT count(*) FROM email_notifications WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until <= now())),
		(SELECT count(*) FROM email_notifications WHERE sent_at IS NULL AND claimed_until > now())`).Scan(&b[0], &b[1], &b[2], &leased); err != nil {
		return err
	}
	st.Backlog[name] = b
	st.Leased[name] = leased
	return nil
}

// escapeLike escapes LIKE's wildcards.
func escapeLike(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// openRecord reports whether a record still waits for recovery.
func openRecord(status string) bool {
	return status == "IN_PROGRESS" || status == "UNKNOWN_REQUIRES_RECOVERY"
}

// quiesce waits until no record of the run is open in its tenant's home
// store and every store's outbox, queue and email backlog is empty, or
// bound passes. It returns the last state read and whether it quiesced.
func quiesce(ctx context.Context, c clusterView, prefix string, bound time.Duration) (*dbState, bool, time.Duration, error) {
	began := time.Now()
	stores := storeURLs(c)
	for {
		homes, err := homeStores(ctx, c)
		if err != nil {
			return nil, false, time.Since(began), err
		}
		st, err := readState(ctx, stores, prefix)
		if err != nil {
			return nil, false, time.Since(began), err
		}
		if len(stuckRecords(st, homes)) == 0 && backlog(st) == 0 {
			return st, true, time.Since(began), nil
		}
		if time.Since(began) > bound {
			return st, false, time.Since(began), nil
		}
		select {
		case <-ctx.Done():
			return st, false, time.Since(began), ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stuckRecords lists the open records in their tenant's home store (or in
// any store when the tenant has none).
func stuckRecords(st *dbState, homes map[string]string) []dbRecord {
	var out []dbRecord
	for _, r := range st.Records {
		if !openRecord(r.Status) {
			continue
		}
		if home := homes[r.Tenant]; home != "" && home != r.Store {
			continue
		}
		out = append(out, r)
	}
	return out
}

func backlog(st *dbState) int {
	n := 0
	for _, b := range st.Backlog {
		n += b[0] + b[1] + b[2]
	}
	return n
}
