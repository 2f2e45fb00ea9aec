package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/pgha"
)

// TestStoreHA runs the global store replicated over three regions: the
// nodes get the multi-host URL, cluster.json lists the members, and when
// the primary member dies the nodes' own pools find the promoted one: an
// answer given before the loss is replayed after it, and new payments
// succeed again through every node.
func TestStoreHA(t *testing.T) {
	requirePatroni(t)
	dir := stateDir(t)
	regions := []string{"eu-west", "us-east", "ap-south"}
	c := startCluster(t, cluster.Config{
		StateDir:    dir,
		Regions:     regions,
		EtcdMembers: 1,
		StoreMode:   cluster.StoreGlobal,
		StoreHA:     true,
	})
	info := c.Info()
	raw, err := os.ReadFile(filepath.Join(dir, cluster.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk struct {
		Store struct {
			Members []struct{ Name, Region, URL string }
		}
	}
	if err := json.Unmarshal(raw, &onDisk); err != nil {
		t.Fatal(err)
	}
	if len(onDisk.Store.Members) != len(regions) {
		t.Fatalf("cluster.json store.members = %+v, want one per region", onDisk.Store.Members)
	}
	for i, m := range onDisk.Store.Members {
		u, err := url.Parse(m.URL)
		if err != nil || m.Name != cluster.StoreMemberName(regions[i]) || m.Region != regions[i] || u.Path != "/"+cluster.GlobalDatabase {
			t.Errorf("store member %d = %+v, want %s in %s with a URL of %s", i, m, cluster.StoreMemberName(regions[i]), regions[i], cluster.GlobalDatabase)
		}
		if _, has := u.User.Password(); has {
			t.Errorf("store member %s: its URL holds the password", m.Name)
		}
	}
	for _, r := range info.Regions {
		u, err := url.Parse(r.DatabaseURL)
		if err != nil || strings.Count(u.Host, ",") != len(regions)-1 || u.Query().Get("target_session_attrs") != "read-write" {
			t.Errorf("region %s: database URL %s, want every member and target_session_attrs=read-write", r.Name, u.Redacted())
		}
	}

	token := info.Tokens["tenant-a"]
	first := postPayment(t, info.Regions[0].URL, token, "ha-1", "invoice-ha-1")
	if first.status != http.StatusCreated {
		t.Fatalf("first payment: %d %s", first.status, first.body)
	}

	store := c.Store()
	leader, err := store.Leader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	// untilServed sends a request again while the node answers 503: until
	// a standby is promoted and the node's pool has found it.
	untilServed := func(post func() response) response {
		t.Helper()
		for {
			a := post()
			if a.status != http.StatusServiceUnavailable || t.Context().Err() != nil {
				return a
			}
		}
	}
	for _, r := range info.Regions {
		// The payment made before the loss replays: from the node's
		// memory at once (its commit was acknowledged, so it is on the
		// synchronous standby), or from the store once it is back.
		for {
			again := postPayment(t, r.URL, token, "ha-1", "invoice-ha-1")
			if again.status == http.StatusCreated {
				if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
					t.Errorf("region %s after the failover: %d (replayed %q)\n%s\nwant the first answer\n%s", r.Name, again.status, again.header.Get("Idempotent-Replayed"), again.body, first.body)
				}
				break
			}
			if again.status != http.StatusServiceUnavailable {
				t.Fatalf("region %s after the failover: %d %s", r.Name, again.status, again.body)
			}
			if t.Context().Err() != nil {
				t.Fatal(t.Context().Err())
			}
		}
		fresh := untilServed(func() response { return postPayment(t, r.URL, token, "ha-new-"+r.Name, "invoice-ha-"+r.Name) })
		if fresh.status != http.StatusCreated {
			t.Errorf("region %s: new payment after the failover: %d %s", r.Name, fresh.status, fresh.body)
		}
	}
	if now, err := store.Leader(t.Context()); err != nil || now == leader {
		t.Errorf("leader after the failover = %v, %v; want another member than %s", now, err, leader.Name)
	}

	var pids []int
	for _, m := range store.Members() {
		if pid := m.Pid(); pid != 0 {
			pids = append(pids, pid)
		}
		if pid := m.PostmasterPid(); pid != 0 {
			pids = append(pids, pid)
		}
	}
	stopCluster(t, c)
	assertGone(t, pids)
	if _, err := pgha.Start(context.Background(), pgha.Options{}); err == nil || errors.Is(err, pgha.ErrNotInstalled) {
		t.Errorf("pgha.Start without members: %v, want a configuration error", err)
	}
}

// TestStoreHATLS runs the replicated store with Config.TLS: the nodes
// reach it over verified TLS, a member refuses a connection without TLS
// or without the password, and the replicas stream from the primary over
// TLS (a synchronous standby exists, so replication works at all).
func TestStoreHATLS(t *testing.T) {
	requirePatroni(t)
	regions := []string{"eu-west", "us-east", "ap-south"}
	c := startCluster(t, cluster.Config{
		StateDir:    stateDir(t),
		Regions:     regions,
		EtcdMembers: 1,
		StoreMode:   cluster.StoreGlobal,
		StoreHA:     true,
		TLS:         true,
	})
	info := c.Info()
	for _, r := range info.Regions {
		u, err := url.Parse(r.DatabaseURL)
		if err != nil || u.Query().Get("sslmode") != "verify-full" || u.Query().Get("sslrootcert") == "" {
			t.Errorf("region %s: database URL %s, want sslmode=verify-full with a root certificate", r.Name, u.Redacted())
		}
	}
	first := postPaymentTLS(t, c.ClientTLS(), info.Regions[1].URL, info.Tokens["tenant-a"], "ha-tls-1", "invoice-ha-tls-1")
	if first.status != http.StatusCreated {
		t.Fatalf("payment over the TLS store: %d %s", first.status, first.body)
	}

	store := c.Store()
	leader, err := store.Leader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	asSuperuser := func(m *pgha.Member, sslmode string) string {
		u, err := url.Parse(m.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(pgha.Superuser, store.Password())
		q := u.Query()
		if sslmode != "" {
			q.Set("sslmode", sslmode)
			q.Del("sslrootcert")
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	for _, m := range store.Members() {
		conn, err := pgx.Connect(t.Context(), asSuperuser(m, "disable"))
		if err == nil {
			_ = conn.Close(t.Context())
			t.Errorf("member %s accepted a connection without TLS", m.Name)
		}
	}
	if conn, err := pgx.Connect(t.Context(), leader.URL("postgres")); err == nil {
		_ = conn.Close(t.Context())
		t.Errorf("member %s accepted a TLS connection without a password", leader.Name)
	}
	conn, err := pgx.Connect(t.Context(), asSuperuser(leader, ""))
	if err != nil {
		t.Fatalf("verified TLS connection to the leader %s: %v", leader.Name, err)
	}
	defer conn.Close(context.Background())
	var encrypted, plain int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
		FROM pg_stat_replication r JOIN pg_stat_ssl s ON s.pid = r.pid`).Scan(&encrypted, &plain); err != nil {
		t.Fatal(err)
	}
	if encrypted != len(regions)-1 || plain != 0 {
		t.Errorf("replication connections on the leader: %d over TLS, %d without; want %d and 0", encrypted, plain, len(regions)-1)
	}

	// The agents' REST API: HTTPS only, and only for a caller with a
	// certificate of the cluster's CA.
	for _, m := range store.Members() {
		api, err := url.Parse(m.APIURL())
		if err != nil || api.Scheme != "https" {
			t.Fatalf("member %s: REST API at %q, want https", m.Name, m.APIURL())
		}
		if resp, err := http.Get("http://" + api.Host + "/cluster"); err == nil {
			resp.Body.Close()
			t.Errorf("member %s: REST API answered plain HTTP (%d)", m.Name, resp.StatusCode)
		}
		noCert := c.ClientTLS()
		noCert.Certificates, noCert.GetClientCertificate = nil, nil
		anon := &http.Client{Transport: &http.Transport{TLSClientConfig: noCert}}
		if resp, err := anon.Get(m.APIURL() + "/cluster"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("member %s: REST API answered a caller without a client certificate", m.Name)
			}
		}
		authed := &http.Client{Transport: &http.Transport{TLSClientConfig: c.ClientTLS()}}
		resp, err := authed.Get(m.APIURL() + "/cluster")
		if err != nil {
			t.Errorf("member %s: REST API with the cluster's certificate: %v", m.Name, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("member %s: REST API with the cluster's certificate: %d", m.Name, resp.StatusCode)
		}
	}
}

// TestStoreHAEffects: in region-local mode, Config.StoreHA replicates the
// effects database, which every region's consumers claim effects in, while
// each region keeps its own store: cluster.json lists the members (with
// the effects database), the nodes get its multi-host URL, and the effects
// of a payment made before its primary is killed and of one made after,
// in another region, are each claimed there.
func TestStoreHAEffects(t *testing.T) {
	requirePatroni(t)
	regions := []string{"eu-west", "us-east", "ap-south"}
	c := startCluster(t, cluster.Config{
		StateDir:    stateDir(t),
		Regions:     regions,
		EtcdMembers: 1,
		StoreHA:     true,
	})
	info := c.Info()
	for _, r := range info.Regions {
		u, err := url.Parse(r.DatabaseURL)
		if err != nil || strings.Contains(u.Host, ",") || u.Path != "/"+cluster.DatabaseName(r.Name) {
			t.Errorf("region %s: database URL %s, want its own store", r.Name, u.Redacted())
		}
	}
	effects, err := url.Parse(c.StoreURL())
	if err != nil || strings.Count(effects.Host, ",") != len(regions)-1 || effects.Path != "/"+cluster.EffectsDatabase {
		t.Fatalf("replicated store URL %s, want every member and %s", effects.Redacted(), cluster.EffectsDatabase)
	}
	if len(info.Store.Members) != len(regions) {
		t.Errorf("cluster.json store.members = %+v, want one per region", info.Store.Members)
	}
	for _, m := range info.Store.Members {
		if u, err := url.Parse(m.URL); err != nil || u.Path != "/"+cluster.EffectsDatabase {
			t.Errorf("store member %s: URL %s, want %s", m.Name, m.URL, cluster.EffectsDatabase)
		}
	}

	// claimed waits until the effects of paymentID are claimed in the
	// replicated store and returns the claiming regions.
	claimed := func(paymentID string) []string {
		t.Helper()
		for t.Context().Err() == nil {
			conn, err := pgx.Connect(t.Context(), c.StoreURL())
			if err == nil {
				rows, qerr := conn.Query(t.Context(), `SELECT region FROM effect_claims WHERE effect_key LIKE '%' || $1 || '%' ORDER BY effect_key`, paymentID)
				var got []string
				if qerr == nil {
					got, qerr = pgx.CollectRows(rows, pgx.RowTo[string])
				}
				_ = conn.Close(t.Context())
				if qerr == nil && len(got) > 0 {
					return got
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("the effects of %s were never claimed", paymentID)
		return nil
	}
	paymentID := func(r response) string {
		t.Helper()
		var p struct {
			PaymentID string `json:"paymentId"`
		}
		if r.status != http.StatusCreated || json.Unmarshal(r.body, &p) != nil || p.PaymentID == "" {
			t.Fatalf("payment: %d %s", r.status, r.body)
		}
		return p.PaymentID
	}

	token := info.Tokens["tenant-a"]
	first := paymentID(postPayment(t, info.Regions[0].URL, token, "fx-1", "invoice-fx-1"))
	if got := claimed(first); len(got) == 0 {
		t.Fatalf("effects of %s: none", first)
	}

	store := c.Store()
	leader, err := store.Leader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Payments do not wait for the effects database: a new one is made at
	// once, and its effects are claimed once a standby is promoted.
	second := paymentID(postPayment(t, info.Regions[1].URL, token, "fx-2", "invoice-fx-2"))
	claimed(second)
	if now, err := store.Leader(t.Context()); err != nil || now == leader {
		t.Errorf("leader after the loss = %v, %v; want another member than %s", now, err, leader.Name)
	}
}

// requirePatroni skips t without Patroni.
func requirePatroni(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("patroni"); err != nil {
		t.Skip(`patroni is not installed (Debian package "patroni")`)
	}
}

// TestProxiedStoreOnly proxies the replicated store's links alone: every
// link is a member's (to etcd, or into its PostgreSQL server or REST API),
// none is a node's, and the nodes serve through their direct connections.
func TestProxiedStoreOnly(t *testing.T) {
	requirePatroni(t)
	regions := []string{"eu-west", "us-east", "ap-south"}
	c := startCluster(t, cluster.Config{
		StateDir:         stateDir(t),
		Regions:          regions,
		NodesPerRegion:   1,
		EtcdMembers:      1,
		StoreMode:        cluster.StoreGlobal,
		StoreHA:          true,
		Proxied:          true,
		ProxiedStoreOnly: true,
	})
	member := map[string]bool{}
	for _, r := range regions {
		member[cluster.StoreMemberName(r)] = true
		member[cluster.StoreMemberName(r)+"-api"] = true
	}
	links := c.Links()
	// Per member: its link to the one etcd member, and the links into its
	// server and its API.
	if len(links) != 3*len(regions) {
		t.Errorf("%d links, want %d: %+v", len(links), 3*len(regions), links)
	}
	for _, l := range links {
		if !member[l.From] && !member[l.To] {
			t.Errorf("link %s is not the replicated store's", l.Name)
		}
	}
	info := c.Info()
	for _, r := range info.Regions {
		if p := postPayment(t, r.URL, info.Tokens["tenant-a"], "direct-"+r.Name, "invoice-direct-"+r.Name); p.status != http.StatusCreated {
			t.Errorf("region %s: %d %s", r.Name, p.status, p.body)
		}
	}
}
