package region

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/adminapi"
	"github.com/idemcoord/idem/internal/ident"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/store"
)

// The node's admin API finds, shows and settles records by hand, for the
// operators who settle what recovery cannot (idemctl records --node). It
// is authenticated by admin tokens of its own (Config.AdminTokens), never
// a tenant's, and sees every tenant's records in the node's store; it is
// never forwarded to another region. docs/openapi.yaml describes it.
//
//	GET  /v1/admin/records?tenant=&operation=&status=&olderThan=&limit=&cursor=  -> 200 {"records","nextCursor"}
//	GET  /v1/admin/records/{tenant}/{operation}/{key}                           -> 200 record
//	POST /v1/admin/records/{tenant}/{operation}/{key}/settle                    -> 200 record
const (
	adminRecords = "/v1/admin/records"
	adminRecord  = adminRecords + "/{tenant}/{operation}/{key}"
)

// settledAs are the statuses a record is settled as by hand, the values of
// idem_records_settled_total's label.
var settledAs = []idem.Status{idem.StatusFailedRetryable, idem.StatusCompleted, idem.StatusFailedReplayable}

// newSettledMetric registers idem_records_settled_total on reg, every
// label value at 0.
func newSettledMetric(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_records_settled_total",
		Help: "Records settled by hand through the node's admin API, by what they were settled as.",
	}, []string{"as"})
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	for _, as := range settledAs {
		c.WithLabelValues(string(as))
	}
	return c, nil
}

// adminDigests checks Config.AdminTokens (token -> principal): a token is
// not empty and is no tenant's, a principal is a name as tenants are
// (ident.CheckTenant). Errors never quote a token.
func adminDigests(admin, tenants map[string]string) ([]tokenDigest, error) {
	var out []tokenDigest
	for token, principal := range admin {
		if token == "" || ident.CheckTenant(principal) != nil {
			return nil, fmt.Errorf("region: Config.AdminTokens: a token is empty or names an invalid principal (1 to %d characters, no white space, ',' or '=')", ident.MaxTenantLen)
		}
		if _, tenant := tenants[token]; tenant {
			return nil, fmt.Errorf("region: Config.AdminTokens: the admin token of %q is also a tenant's token; an admin token must be its own", principal)
		}
		out = append(out, tokenDigest{sum: sha256.Sum256([]byte(token)), name: principal})
	}
	return out, nil
}

// registerAdmin mounts the admin API on mux.
func (s *Server) registerAdmin(mux *routeMux) {
	mux.HandleFunc("GET "+adminRecords, s.adminAuth(s.handleAdminList))
	mux.HandleFunc("GET "+adminRecord, s.adminAuth(s.handleAdminShow))
	mux.HandleFunc("POST "+adminRecord+"/settle", s.adminAuth(s.handleAdminSettle))
	for p, allow := range map[string]string{
		adminRecords:            "GET, HEAD",
		adminRecord:             "GET, HEAD",
		adminRecord + "/settle": http.MethodPost,
	} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			s.writeError(w, r, idem.Errorf(idem.ECodeMethodNotAllowed, "The method is not allowed here."))
		})
	}
}

// adminAuth answers 401 unless the request carries one of the admin
// tokens (compared in constant time over digests, as tenant tokens are),
// and passes its principal on. A tenant's token is no admin token.
func (s *Server) adminAuth(h func(w http.ResponseWriter, r *http.Request, principal string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		principal := ""
		if ok && token != "" {
			principal = nameOf(s.adminTokens, token)
		}
		if principal == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem-admin"`)
			s.writeError(w, r, idem.Errorf(idem.ECodeUnauthenticated, "A valid admin token is required."))
			return
		}
		h(w, r, principal)
	}
}

// listParams are the query parameters of GET /v1/admin/records.
var listParams = map[string]bool{"tenant": true, "operation": true, "status": true, "olderThan": true, "limit": true, "cursor": true}

func (s *Server) handleAdminList(w http.ResponseWriter, r *http.Request, _ string) {
	f, err := listFilter(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.store.ListRecords(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := adminapi.RecordList{Records: make([]adminapi.Record, 0, len(page.Records))}
	for i := range page.Records {
		out.Records = append(out.Records, adminRecordOf(&page.Records[i]))
	}
	if page.Next != nil {
		out.NextCursor = encodeCursor(*page.Next)
	}
	writeJSON(w, http.StatusOK, out)
}

// listFilter reads the list's query: each parameter at most once, none
// unknown (a misspelt filter must not list everything).
func listFilter(q url.Values) (store.RecordFilter, error) {
	for name, vs := range q {
		if !listParams[name] || len(vs) != 1 {
			return store.RecordFilter{}, idem.Errorf(idem.ECodeValidationFailed,
				"The query parameters are tenant, operation, status, olderThan, limit and cursor, each at most once.")
		}
	}
	f := store.RecordFilter{Tenant: q.Get("tenant"), Operation: q.Get("operation"), Status: idem.Status(q.Get("status"))}
	if v := q.Get("olderThan"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return f, idem.Errorf(idem.ECodeValidationFailed, "Parameter \"olderThan\" is a duration such as 90s, 10m or 1h30m.")
		}
		f.OlderThan = d
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.MaxListLimit {
			return f, idem.Errorf(idem.ECodeValidationFailed, "Parameter \"limit\" is 1 to %d.", store.MaxListLimit)
		}
		f.Limit = n
	}
	if v := q.Get("cursor"); v != "" {
		after, err := decodeCursor(v)
		if err != nil {
			return f, err
		}
		f.After = &after
	}
	return f, nil
}

// encodeCursor makes the opaque cursor of the page after scope:
// base64url (no padding) of the JSON array [tenant, operation, key].
func encodeCursor(scope idem.Scope) string {
	b, _ := json.Marshal([3]string{scope.Tenant, scope.Operation, scope.Key})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(v string) (idem.Scope, error) {
	var parts []string
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err == nil {
		err = json.Unmarshal(b, &parts)
	}
	if err == nil && len(parts) != 3 {
		err = fmt.Errorf("a cursor of %d parts", len(parts))
	}
	if err != nil {
		return idem.Scope{}, &idem.Error{Code: idem.ECodeValidationFailed, Message: "Parameter \"cursor\" is not a cursor this API gave.", Err: err}
	}
	return idem.Scope{Tenant: parts[0], Operation: parts[1], Key: parts[2]}, nil
}

// adminScope reads {tenant}, {operation} and {key}; store.Inspect and
// store.Settle check them.
func adminScope(r *http.Request) idem.Scope {
	return idem.Scope{Tenant: r.PathValue("tenant"), Operation: r.PathValue("operation"), Key: r.PathValue("key")}
}

func (s *Server) handleAdminShow(w http.ResponseWriter, r *http.Request, _ string) {
	info, err := s.store.Inspect(r.Context(), adminScope(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, adminRecordOf(info))
}

// handleAdminSettle settles a record by hand (store.Store.Settle) as the
// principal of the admin token, through this node, and counts it.
func (s *Server) handleAdminSettle(w http.ResponseWriter, r *http.Request, principal string) {
	scope := adminScope(r)
	if f := telemetry.RequestOf(r.Context()); f != nil {
		f.Tenant, f.Operation, f.KeyHash = scope.Tenant, scope.Operation, telemetry.KeyHash(scope.Key)
	}
	req, err := s.settleRequest(w, r, scope, principal)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	info, err := s.store.Settle(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.settled.WithLabelValues(string(req.As)).Inc()
	writeJSON(w, http.StatusOK, adminRecordOf(info))
}

// settleRequest decodes a settle's body (strict JSON, application/json,
// within MaxBodyBytes). Who settles is the admin token's principal, as
// seen by this node: "<principal> via node <NodeID>".
func (s *Server) settleRequest(w http.ResponseWriter, r *http.Request, scope idem.Scope, principal string) (store.SettleRequest, error) {
	var in adminapi.SettleRequest
	if err := s.decodeCoordBody(w, r, &in); err != nil {
		return store.SettleRequest{}, err
	}
	switch {
	case in.As == nil:
		return store.SettleRequest{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"as\" is required.")
	case in.Reason == nil:
		return store.SettleRequest{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"reason\" is required.")
	}
	req := store.SettleRequest{Scope: scope, As: idem.Status(*in.As), Reason: *in.Reason, By: principal + " via node " + s.cfg.NodeID}
	if a := in.Answer; a != nil {
		if a.Status == nil {
			return store.SettleRequest{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"answer.status\" is required.")
		}
		req.Response = &idem.Response{Status: *a.Status, Headers: a.Headers, Body: a.Body}
	}
	return req, nil
}

// adminRecordOf is the admin API's view of info: the inspection view of
// its record (viewOf) and what an operator needs besides.
func adminRecordOf(info *store.RecordInfo) adminapi.Record {
	out := adminapi.Record{Tenant: info.Record.Tenant, Record: *viewOf(&info.Record), ResponseBytes: info.ResponseBytes,
		LockHeld: info.LockHeld(), Stuck: info.Stuck(), StoreTime: info.StoreTime}
	if r := info.Record.Response; r != nil {
		out.ResponseByReference = r.ByReference
	}
	if st := info.Settlement; st != nil {
		out.Settlement = &adminapi.Settlement{As: string(st.As), By: st.By, At: st.At, Reason: st.Reason}
	}
	return out
}
