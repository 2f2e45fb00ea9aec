package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/adminapi"
	"github.com/idemcoord/idem/coordclient"
	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/store"
)

// runRecords finds, shows and settles records by hand ("idemctl records
// list|show|settle"), over the store (--database-url) or a node's admin
// API (--node, with an admin token): what operators settle when recovery
// cannot (docs/runbooks.md, "Settling a record").
func runRecords(ctx context.Context, args []string, env *Env) error {
	if len(args) == 0 {
		return usageError{errors.New("usage: idemctl records list|show|settle [flags]; idemctl records <command> -h for its flags")}
	}
	switch args[0] {
	case "list":
		return runRecordsList(ctx, args[1:], env)
	case "show":
		return runRecordsShow(ctx, args[1:], env)
	case "settle":
		return runRecordsSettle(ctx, args[1:], env)
	}
	return usageError{fmt.Errorf("unknown records command %q: want list, show or settle", args[0])}
}

// recordsTarget is where the records are read and settled: the store
// (--database-url) or a node's admin API (--node).
type recordsTarget struct {
	databaseURL, node, tokenFile, caFile string
}

func (t *recordsTarget) register(fs *flag.FlagSet) {
	fs.StringVar(&t.databaseURL, "database-url", "", "URL of the store (the nodes' --database-url), as a role that may read and write idempotency_records; or --node")
	fs.StringVar(&t.node, "node", "", "base URL of a node whose admin API to use instead of --database-url (its own store; the admin token from --admin-token-file or IDEM_ADMIN_TOKEN)")
	fs.StringVar(&t.tokenFile, "admin-token-file", "", "file holding the node's admin token, one of its --admin-tokens-file (or IDEM_ADMIN_TOKEN); with --node")
	fs.StringVar(&t.caFile, "ca-file", "", "CA (PEM) that verifies an https --node (default: the system's roots)")
}

// open connects to the target.
func (t *recordsTarget) open(ctx context.Context, env *Env) (recordsBackend, error) {
	switch {
	case t.databaseURL != "" && t.node != "":
		return nil, usageError{errors.New("both --database-url (or IDEM_DATABASE_URL) and --node (or IDEM_NODE) are set; set one")}
	case t.databaseURL != "":
		if t.tokenFile != "" || t.caFile != "" {
			return nil, usageError{errors.New("--admin-token-file and --ca-file go with --node")}
		}
		// The settle's log line goes to stderr, as a node logs its own.
		st, err := store.Open(ctx, t.databaseURL, store.Options{MaxConns: 2, Logger: slog.New(slog.NewTextHandler(env.Stderr, nil))})
		if err != nil {
			return nil, err
		}
		return storeRecords{st}, nil
	case t.node != "":
		return t.nodeRecords(env)
	}
	return nil, usageError{fmt.Errorf("--database-url (or %s) or --node (or %s) is required", cli.EnvName("database-url"), cli.EnvName("node"))}
}

func (t *recordsTarget) nodeRecords(env *Env) (recordsBackend, error) {
	u, err := url.Parse(t.node)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError{fmt.Errorf("--node %q is not an http(s) URL", t.node)}
	}
	token, warn, err := cli.KeyFromFileOrEnv("--admin-token-file", t.tokenFile, "IDEM_ADMIN_TOKEN", env.Getenv("IDEM_ADMIN_TOKEN"))
	if warn != "" {
		fmt.Fprintln(env.Stderr, "idemctl records:", warn)
	}
	switch {
	case err != nil:
		return nil, usageError{err}
	case token == "":
		return nil, usageError{errors.New("--node needs the node's admin token: --admin-token-file or IDEM_ADMIN_TOKEN (never on the command line)")}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if t.caFile != "" {
		roots, err := tlsutil.NewPool(t.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		tr.TLSClientConfig = tlsutil.ClientConfig(roots, nil)
	}
	return &nodeRecords{base: strings.TrimSuffix(u.String(), "/"), token: token, http: &http.Client{Transport: tr, Timeout: time.Minute}}, nil
}

// recordsBackend is what the records commands need of their target.
type recordsBackend interface {
	// each calls fn with every record f selects (f.Limit is the page
	// size), page by page, until fn returns false.
	each(ctx context.Context, f store.RecordFilter, fn func(*store.RecordInfo) bool) error
	show(ctx context.Context, scope idem.Scope) (*store.RecordInfo, error)
	// settle settles as req says; a node names who settles itself (the
	// admin token's name), so req.By is only the store's.
	settle(ctx context.Context, req store.SettleRequest) (*store.RecordInfo, error)
	close()
}

// scopeFlags are --tenant, --operation and --key.
type scopeFlags struct{ tenant, operation, key string }

func (s *scopeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.tenant, "tenant", "", "the record's tenant (required)")
	fs.StringVar(&s.operation, "operation", "", "the record's operation (required)")
	fs.StringVar(&s.key, "key", "", "the record's idempotency key (required)")
}

func (s *scopeFlags) scope() (idem.Scope, error) {
	if s.tenant == "" || s.operation == "" || s.key == "" {
		return idem.Scope{}, usageError{errors.New("--tenant, --operation and --key are required")}
	}
	return idem.Scope{Tenant: s.tenant, Operation: s.operation, Key: s.key}, nil
}

func newRecordsFlags(name, usage string, env *Env) *flag.FlagSet {
	fs := flag.NewFlagSet("records "+name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: idemctl records "+usage)
		fs.PrintDefaults()
	}
	return fs
}

// listPage is the page size records list asks for.
const listPage = 500

func runRecordsList(ctx context.Context, args []string, env *Env) error {
	fs := newRecordsFlags("list", "list (--database-url URL | --node URL) [--tenant T] [--operation OP] [--status S] [--older-than D] [--limit N]\n\n"+
		"One record a line, key first: key tenant operation status checkpoint age=(since creation, store clock) attempts= token= lock=none|held|expired.", env)
	var target recordsTarget
	target.register(fs)
	var f store.RecordFilter
	fs.StringVar(&f.Tenant, "tenant", "", "only this tenant's records")
	fs.StringVar(&f.Operation, "operation", "", "only this operation's records")
	status := fs.String("status", "", "only records in this state: IN_PROGRESS, COMPLETED, FAILED_REPLAYABLE, FAILED_RETRYABLE, UNKNOWN_REQUIRES_RECOVERY or EXPIRED")
	fs.DurationVar(&f.OlderThan, "older-than", 0, "only records created more than this long ago, by the store's clock (0: any age)")
	limit := fs.Int("limit", 1000, "print at most this many records (0: all); a note on stderr says when more follow")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	if *limit < 0 || f.OlderThan < 0 {
		return usageError{errors.New("--limit and --older-than must not be negative")}
	}
	f.Status = idem.Status(*status)
	b, err := target.open(ctx, env)
	if err != nil {
		return err
	}
	defer b.close()
	f.Limit = listPage
	if *limit > 0 {
		f.Limit = min(listPage, *limit+1) // one more says whether more follow
	}
	printed, more := 0, false
	err = b.each(ctx, f, func(r *store.RecordInfo) bool {
		if *limit > 0 && printed == *limit {
			more = true
			return false
		}
		fmt.Fprintln(env.Stdout, recordLine(r))
		printed++
		return true
	})
	if err != nil {
		return err
	}
	if more {
		fmt.Fprintf(env.Stderr, "idemctl records list: more than %d records; narrow the filters or raise --limit (0: all)\n", *limit)
	}
	return nil
}

// recordLine is a record's line in records list: key first, then fields
// without spaces (no key, tenant, operation, status or checkpoint holds
// one).
func recordLine(r *store.RecordInfo) string {
	rec := &r.Record
	lock := "none"
	switch {
	case r.LockHeld():
		lock = "held"
	case rec.LockedUntil != nil:
		lock = "expired"
	}
	return fmt.Sprintf("%s %s %s %s %s age=%s attempts=%d token=%d lock=%s", rec.Key, rec.Tenant, rec.Operation, rec.Status, rec.Checkpoint,
		age(r.StoreTime, rec.CreatedAt), rec.Attempts, rec.FencingToken, lock)
}

// age is how long before now t was, to the second.
func age(now, t time.Time) time.Duration { return now.Sub(t).Round(time.Second) }

func runRecordsShow(ctx context.Context, args []string, env *Env) error {
	fs := newRecordsFlags("show", "show (--database-url URL | --node URL) --tenant T --operation OP --key K", env)
	var (
		target recordsTarget
		sf     scopeFlags
	)
	target.register(fs)
	sf.register(fs)
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	scope, err := sf.scope()
	if err != nil {
		return err
	}
	b, err := target.open(ctx, env)
	if err != nil {
		return err
	}
	defer b.close()
	r, err := b.show(ctx, scope)
	if err != nil {
		return err
	}
	writeRecord(env.Stdout, r)
	return nil
}

// writeRecord prints one record, a field a line: never the stored answer's
// headers or body.
func writeRecord(w io.Writer, r *store.RecordInfo) {
	rec := &r.Record
	line := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%-15s "+format+"\n", append([]any{name + ":"}, args...)...)
	}
	stamp := func(t time.Time) string {
		return t.UTC().Format(time.RFC3339Nano) + " (" + age(r.StoreTime, t).String() + " ago)"
	}
	line("tenant", "%s", rec.Tenant)
	line("operation", "%s", rec.Operation)
	line("key", "%s", rec.Key)
	stuck := "not stuck"
	if r.Stuck() {
		stuck = "stuck: can be settled"
	}
	line("status", "%s (%s)", rec.Status, stuck)
	line("checkpoint", "%s", rec.Checkpoint)
	line("owner", "%s", rec.Owner)
	line("fencing token", "%d", rec.FencingToken)
	switch {
	case rec.LockedUntil == nil:
		line("lock", "none")
	case r.LockHeld():
		line("lock", "held until %s (%s more)", rec.LockedUntil.UTC().Format(time.RFC3339Nano), rec.LockedUntil.Sub(r.StoreTime).Round(time.Millisecond))
	default:
		line("lock", "ran out at %s", stamp(*rec.LockedUntil))
	}
	line("attempts", "%d", rec.Attempts)
	line("generation", "%d", rec.Generation)
	line("created", "%s", stamp(rec.CreatedAt))
	line("updated", "%s", stamp(rec.UpdatedAt))
	line("expires", "%s", rec.ExpiresAt.UTC().Format(time.RFC3339Nano))
	switch a := rec.Response; {
	case a == nil:
		line("answer", "none")
	case a.ByReference:
		line("answer", "status %d, rendered from %s %s", a.Status, rec.ResourceType, rec.ResourceID)
	default:
		line("answer", "status %d, %d bytes", a.Status, r.ResponseBytes)
	}
	if rec.ResourceType != "" || rec.ResourceID != "" {
		line("resource", "%s %s", rec.ResourceType, rec.ResourceID)
	}
	if rec.ErrorCode != "" {
		line("error code", "%s", rec.ErrorCode)
	}
	line("home region", "%s", rec.HomeRegion)
	if s := r.Settlement; s != nil {
		line("settled", "as %s by %s at %s", s.As, s.By, s.At.UTC().Format(time.RFC3339Nano))
		line("reason", "%s", s.Reason)
	}
}

// headerFlags is the repeatable --header "Name: value".
type headerFlags map[string]string

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("want \"Name: value\"")
	}
	h[strings.TrimSpace(name)] = strings.TrimSpace(value)
	return nil
}

func runRecordsSettle(ctx context.Context, args []string, env *Env) error {
	fs := newRecordsFlags("settle", "settle (--database-url URL | --node URL) --tenant T --operation OP --key K "+
		"--as FAILED_RETRYABLE|COMPLETED|FAILED_REPLAYABLE [--status-code N --body-file F [--header 'Name: value']...] --reason TEXT\n\n"+
		"Only after a person asked downstream what happened to the record (docs/runbooks.md, \"Settling a record\"):\n"+
		"FAILED_RETRYABLE if it did not happen (the next retry runs the operation again), COMPLETED or\n"+
		"FAILED_REPLAYABLE with downstream's answer if it did (every retry replays it).", env)
	var (
		target  recordsTarget
		sf      scopeFlags
		headers = headerFlags{}
	)
	target.register(fs)
	sf.register(fs)
	as := fs.String("as", "", "what the record becomes: FAILED_RETRYABLE, COMPLETED or FAILED_REPLAYABLE (required)")
	statusCode := fs.Int("status-code", 0, "with COMPLETED or FAILED_REPLAYABLE: the answer's HTTP status code")
	bodyFile := fs.String("body-file", "", "with COMPLETED or FAILED_REPLAYABLE: file holding the answer's body, byte for byte")
	fs.Var(headers, "header", "with COMPLETED or FAILED_REPLAYABLE: a header of the answer, \"Name: value\" (repeatable)")
	reason := fs.String("reason", "", "why: who asked whom downstream and what they answered (a ticket, downstream's reference); kept in the record (required)")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	scope, err := sf.scope()
	if err != nil {
		return err
	}
	req := store.SettleRequest{Scope: scope, As: idem.Status(*as), Reason: *reason}
	switch {
	case *reason == "":
		return usageError{errors.New("--reason is required: who asked whom downstream and what they answered")}
	case req.As == idem.StatusFailedRetryable:
		if *statusCode != 0 || *bodyFile != "" || len(headers) > 0 {
			return usageError{errors.New("--as FAILED_RETRYABLE stores no answer: drop --status-code, --body-file and --header")}
		}
	case req.As == idem.StatusCompleted || req.As == idem.StatusFailedReplayable:
		if *statusCode == 0 || *bodyFile == "" {
			return usageError{fmt.Errorf("--as %s needs the answer: --status-code and --body-file (an empty file for no body)", req.As)}
		}
		body, err := os.ReadFile(*bodyFile)
		if err != nil {
			return fmt.Errorf("--body-file: %w", err)
		}
		req.Response = &idem.Response{Status: *statusCode, Body: body}
		if len(headers) > 0 {
			req.Response.Headers = headers
		}
	default:
		return usageError{errors.New("--as is FAILED_RETRYABLE, COMPLETED or FAILED_REPLAYABLE")}
	}
	b, err := target.open(ctx, env)
	if err != nil {
		return err
	}
	defer b.close()
	req.By = settler(env)
	r, err := b.settle(ctx, req)
	if err != nil {
		return err
	}
	writeRecord(env.Stdout, r)
	return nil
}

// settler names who settles over --database-url: the OS user and host
// (user@host), as the record keeps it.
func settler(env *Env) string {
	name := env.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host
}

// storeRecords reads and settles in the store.
type storeRecords struct{ st *store.Store }

func (s storeRecords) each(ctx context.Context, f store.RecordFilter, fn func(*store.RecordInfo) bool) error {
	for {
		page, err := s.st.ListRecords(ctx, f)
		if err != nil {
			return err
		}
		for i := range page.Records {
			if !fn(&page.Records[i]) {
				return nil
			}
		}
		if page.Next == nil {
			return nil
		}
		f.After = page.Next
	}
}

func (s storeRecords) show(ctx context.Context, scope idem.Scope) (*store.RecordInfo, error) {
	return s.st.Inspect(ctx, scope)
}

func (s storeRecords) settle(ctx context.Context, req store.SettleRequest) (*store.RecordInfo, error) {
	return s.st.Settle(ctx, req)
}

func (s storeRecords) close() { s.st.Close() }

// nodeRecords reads and settles through a node's admin API.
type nodeRecords struct {
	base, token string
	http        *http.Client
}

func (n *nodeRecords) each(ctx context.Context, f store.RecordFilter, fn func(*store.RecordInfo) bool) error {
	q := url.Values{}
	for name, v := range map[string]string{"tenant": f.Tenant, "operation": f.Operation, "status": string(f.Status)} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if f.OlderThan > 0 {
		q.Set("olderThan", f.OlderThan.String())
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	for {
		var page adminapi.RecordList
		if err := n.call(ctx, http.MethodGet, "/v1/admin/records?"+q.Encode(), nil, &page); err != nil {
			return err
		}
		for i := range page.Records {
			if !fn(recordInfoOf(&page.Records[i])) {
				return nil
			}
		}
		if page.NextCursor == "" {
			return nil
		}
		q.Set("cursor", page.NextCursor)
	}
}

func (n *nodeRecords) show(ctx context.Context, scope idem.Scope) (*store.RecordInfo, error) {
	var r adminapi.Record
	if err := n.call(ctx, http.MethodGet, recordPath(scope), nil, &r); err != nil {
		return nil, err
	}
	return recordInfoOf(&r), nil
}

func (n *nodeRecords) settle(ctx context.Context, req store.SettleRequest) (*store.RecordInfo, error) {
	as := string(req.As)
	in := adminapi.SettleRequest{As: &as, Reason: &req.Reason}
	if r := req.Response; r != nil {
		in.Answer = &adminapi.AnswerInput{Status: &r.Status, Headers: r.Headers, Body: r.Body}
	}
	var out adminapi.Record
	if err := n.call(ctx, http.MethodPost, recordPath(req.Scope)+"/settle", in, &out); err != nil {
		return nil, err
	}
	return recordInfoOf(&out), nil
}

func (n *nodeRecords) close() { n.http.CloseIdleConnections() }

// recordPath is the admin API's path of scope's record, each part one
// escaped path segment.
func recordPath(scope idem.Scope) string {
	return "/v1/admin/records/" + url.PathEscape(scope.Tenant) + "/" + url.PathEscape(scope.Operation) + "/" + url.PathEscape(scope.Key)
}

// call sends one admin API request and decodes its answer into out; an
// error answer (a problem) becomes an error with its status, code and
// detail.
func (n *nodeRecords) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, n.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+n.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, req.URL.Redacted(), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, req.URL.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		var p struct {
			ErrorCode string `json:"errorCode"`
			Detail    string `json:"detail"`
		}
		if json.Unmarshal(b, &p) != nil || p.ErrorCode == "" {
			return fmt.Errorf("%s %s: %s", method, req.URL.Redacted(), resp.Status)
		}
		return &idem.Error{Code: p.ErrorCode, Message: p.Detail, Err: fmt.Errorf("the node answered %s", resp.Status)}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: the answer: %w", method, req.URL.Redacted(), err)
	}
	return nil
}

// recordInfoOf is the store's view of a record the admin API sent.
func recordInfoOf(r *adminapi.Record) *store.RecordInfo {
	info := &store.RecordInfo{Record: *coordclient.RecordOf(r.Tenant, &r.Record, nil), ResponseBytes: r.ResponseBytes, StoreTime: r.StoreTime}
	if r.ResponseStatus != 0 {
		info.Record.Response = &idem.Response{Status: r.ResponseStatus, SchemaVersion: r.ResponseSchemaVersion, ByReference: r.ResponseByReference}
	}
	if s := r.Settlement; s != nil {
		info.Settlement = &store.Settlement{As: idem.Status(s.As), By: s.By, At: s.At, Reason: s.Reason}
	}
	return info
}
