package outbox_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/store"
)

// age moves every outbox timestamp back by d, keeping their order.
func age(t *testing.T, st *store.Store, d time.Duration) {
	t.Helper()
	iv := d.String()
	storetest.Exec(t, st, `UPDATE outbox_events SET created_at = created_at - $1::INTERVAL, published_at = published_at - $1::INTERVAL`, iv)
	storetest.Exec(t, st, `UPDATE queue_messages SET enqueued_at = enqueued_at - $1::INTERVAL, processed_at = processed_at - $1::INTERVAL`, iv)
	storetest.Exec(t, st, `UPDATE consumer_inbox SET processed_at = processed_at - $1::INTERVAL`, iv)
	storetest.Exec(t, st, `UPDATE email_notifications SET created_at = created_at - $1::INTERVAL, sent_at = sent_at - $1::INTERVAL`, iv)
}

// pruneAll runs Prune in batches of limit until none comes out full.
func pruneAll(t *testing.T, st *store.Store, retention time.Duration, limit int) outbox.Pruned {
	t.Helper()
	var sum outbox.Pruned
	for range 100 {
		p, err := outbox.Prune(context.Background(), st, retention, limit)
		if err != nil {
			t.Fatalf("Prune: %v", err)
		}
		sum.Events += p.Events
		sum.Deliveries += p.Deliveries
		sum.Inbox += p.Inbox
		sum.Emails += p.Emails
		if !p.Full(limit) {
			return sum
		}
	}
	t.Fatal("Prune kept finding full batches")
	return sum
}

// TestPruneKeepsWhatADeliveryMayNeed: with every delivery made twice,
// Prune deletes the published events, processed deliveries, sent receipts
// and inbox rows older than the retention, keeps everything younger, and
// keeps an old inbox row while a copy of its message is still pending, so
// that copy is still a duplicate (one receipt, not two). Once nothing is
// pending, the rest goes too.
func TestPruneKeepsWhatADeliveryMayNeed(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	pub := outbox.NewPublisher(st, outbox.PublisherConfig{Duplicate: true})
	cons := outbox.NewConsumers(st)
	sender := outbox.NewSender(st, nil)

	// pay_1: two events, six deliveries (ledger: created and confirmed,
	// receipt: confirmed; each twice). The ledger takes all four; the
	// receipt consumer one, leaving its copy pending; the receipt is sent.
	addPayment(t, st, "pay_1", "CONFIRMED")
	publishAll(t, pub)
	consumeAll(t, cons, outbox.ConsumerLedger)
	if s, err := cons.ConsumeBatch(ctx, outbox.ConsumerReceiptEmail, 1); err != nil || s.Processed != 1 {
		t.Fatalf("ConsumeBatch(receipt, 1) = %+v, %v; want one processed", s, err)
	}
	if n := sendAll(t, sender); n != 1 {
		t.Fatalf("sent %d; want 1", n)
	}
	age(t, st, 2*time.Hour)
	// pay_2: recent, published and taken by the ledger.
	addPayment(t, st, "pay_2", "CONFIRMED")
	publishAll(t, pub)
	consumeAll(t, cons, outbox.ConsumerLedger)

	got := pruneAll(t, st, time.Hour, 2)
	if want := (outbox.Pruned{Events: 2, Deliveries: 5, Inbox: 2, Emails: 1}); got != want {
		t.Errorf("first prune = %+v; want %+v (pay_1's, but for its receipt's inbox row)", got, want)
	}
	if n := count(t, st, `SELECT count(*) FROM consumer_inbox WHERE consumer_name = $1`, outbox.ConsumerReceiptEmail); n != 1 {
		t.Errorf("receipt inbox rows = %d; want pay_1's, kept while its copy is pending", n)
	}
	if n := count(t, st, `SELECT count(*) FROM outbox_events`); n != 2 {
		t.Errorf("outbox events = %d; want pay_2's two", n)
	}

	// The pending copy of pay_1's receipt delivery is a duplicate.
	s := consumeAll(t, cons, outbox.ConsumerReceiptEmail)
	if want := (outbox.Stats{Processed: 1, Duplicates: 2}); s != want {
		t.Errorf("receipt consumer = %+v; want %+v (pay_1's copy a duplicate; pay_2 once)", s, want)
	}
	sendAll(t, sender)
	for _, id := range []string{"pay_1", "pay_2"} {
		if n := count(t, st, `SELECT count(*) FROM sent_emails WHERE dedupe_key = $1`, "receipt_payment_"+id); n != 1 {
			t.Errorf("%s: receipt sent %d times; want 1", id, n)
		}
	}

	age(t, st, 2*time.Hour)
	got = pruneAll(t, st, time.Hour, 3)
	if want := (outbox.Pruned{Events: 2, Deliveries: 7, Inbox: 4, Emails: 1}); got != want {
		t.Errorf("second prune = %+v; want %+v", got, want)
	}
	for table, want := range map[string]int{"outbox_events": 0, "queue_messages": 0, "consumer_inbox": 0,
		"email_notifications": 0, "payments": 2, "ledger_entries": 4, "sent_emails": 2} {
		if n := count(t, st, `SELECT count(*) FROM `+table); n != want {
			t.Errorf("%s: %d rows left; want %d", table, n, want)
		}
	}
}

// TestPruneArguments: a batch limit or a retention below one is refused.
func TestPruneArguments(t *testing.T) {
	st, _ := storetest.New(t)
	if _, err := outbox.Prune(context.Background(), st, time.Hour, 0); err == nil {
		t.Error("limit 0 accepted")
	}
	if _, err := outbox.Prune(context.Background(), st, 0, 10); err == nil {
		t.Error("retention 0 accepted")
	}
}

// placeholderTimes finds a bind placeholder ($n, with any ::TYPE cast it
// carries) multiplied, on either side of the '*', in SQL text.
var (
	placeholderTimes = regexp.MustCompile(`(?i)\$\d+(\s*::\s*[a-z_][a-z0-9_]*)?\s*\*`)
	timesPlaceholder = regexp.MustCompile(`(?i)\*\s*\$\d+(\s*::\s*[a-z_][a-z0-9_]*)?`)
)

// TestIntervalPlaceholdersAreCast: every SQL statement in the repository's
// Go files (its string literals) that multiplies a placeholder in a
// statement with an INTERVAL casts the placeholder ($1::INT8 * INTERVAL
// '1 millisecond'): CockroachDB has INT, FLOAT and DECIMAL overloads of
// the product with an interval and cannot pick one for an untyped
// placeholder (PostgreSQL can, so its tests alone would never tell).
func TestIntervalPlaceholdersAreCast(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("the repository root (with go.work) is not %s: %v", root, err)
	}
	cast, files := 0, 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			sql, err := strconv.Unquote(lit.Value)
			if err != nil || !strings.Contains(strings.ToUpper(sql), "INTERVAL") {
				return true
			}
			for _, re := range []*regexp.Regexp{placeholderTimes, timesPlaceholder} {
				for _, m := range re.FindAllStringSubmatchIndex(sql, -1) {
					if m[2] >= 0 {
						cast++
						continue
					}
					rel, _ := filepath.Rel(root, path)
					line := fset.Position(lit.Pos()).Line + strings.Count(sql[:m[0]], "\n")
					t.Errorf("%s:%d: %q multiplies a placeholder without a cast; CockroachDB cannot choose an overload (write $n::INT8)",
						rel, line, strings.TrimSpace(sql[m[0]:m[1]]))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The scan saw the repository: the store's claims alone multiply cast
	// placeholders by intervals.
	if files < 100 || cast < 5 {
		t.Fatalf("scanned %d Go files and found %d cast placeholders times an interval; the scan missed the repository", files, cast)
	}
}
