package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/procfs"
	"github.com/idemcoord/idem/provider/simulator"
)

// SoakSample is what the soak measured at one moment: the traffic of the
// interval that ended then, every node's own metrics, every store and the
// provider simulator.
type SoakSample struct {
	// T is the end of the interval, in seconds from the start of traffic;
	// Seconds its length.
	T       float64 `json:"t"`
	Seconds float64 `json:"seconds"`
	// Calls, Errors and Wrong count the interval's calls (see SoakCounts);
	// Rate is answered calls (Calls - Errors) per second; P50ms and P99ms
	// are the latencies of answered calls.
	Calls  int64            `json:"calls"`
	Errors int64            `json:"errors"`
	Wrong  int64            `json:"wrong"`
	Rate   float64          `json:"rate"`
	ByKind map[string]int64 `json:"byKind"`
	P50ms  float64          `json:"p50ms"`
	P99ms  float64          `json:"p99ms"`
	// Fault names the faults active during the interval.
	Fault    string          `json:"fault,omitempty"`
	Nodes    []NodeSample    `json:"nodes"`
	Stores   []StoreSample   `json:"stores"`
	Postgres *PostgresSample `json:"postgres,omitempty"`
	Provider *ProviderSample `json:"provider,omitempty"`
	Errs     []string        `json:"sampleErrors,omitempty"` // what could not be sampled
	Load     string          `json:"load,omitempty"`         // /proc/loadavg
	Machine  *MachineSample  `json:"machine,omitempty"`
}

// NodeSample is one node's own metrics (its /metrics).
type NodeSample struct {
	Name string `json:"name"`
	// StartTime is process_start_time_seconds: it changes when the node
	// restarts. 0: the node could not be scraped.
	StartTime    float64 `json:"startTime"`
	RSSBytes     float64 `json:"rssBytes"`
	HeapBytes    float64 `json:"heapBytes"`
	Goroutines   float64 `json:"goroutines"`
	OpenFDs      float64 `json:"openFds"`
	PoolTotal    float64 `json:"poolTotal"`
	PoolAcquired float64 `json:"poolAcquired"`
	PoolMax      float64 `json:"poolMax"`
	CPUSeconds   float64 `json:"cpuSeconds"`
}

// StoreSample is one region's database.
type StoreSample struct {
	Region string `json:"region"`
	// Records is idempotency_records' live row estimate (n_live_tup).
	Records int64 `json:"records"`
	// OutboxBacklog counts unpublished outbox events, QueuePending
	// unprocessed deliveries, EmailsUnsent receipts not sent yet.
	OutboxBacklog int64 `json:"outboxBacklog"`
	QueuePending  int64 `json:"queuePending"`
	EmailsUnsent  int64 `json:"emailsUnsent"`
	// DatabaseBytes is pg_database_size.
	DatabaseBytes int64 `json:"databaseBytes"`
	// Commits and Rollbacks count the database's transactions so far
	// (pg_stat_database); a rollback is mostly a serialization failure
	// the node retried.
	Commits   int64 `json:"commits"`
	Rollbacks int64 `json:"rollbacks"`
	// BlocksRead counts the blocks the database read from outside its
	// shared buffers (the OS page cache or the disk), BlocksHit those
	// found in them (pg_stat_database blks_read, blks_hit).
	BlocksRead int64         `json:"blocksRead"`
	BlocksHit  int64         `json:"blocksHit"`
	Tables     []TableSample `json:"tables"`
	Indexes    []IndexSample `json:"indexes"`
}

// MachineSample is the machine's memory and disk traffic (/proc/meminfo,
// /proc/vmstat): what every process on it shares.
type MachineSample struct {
	MemFreeBytes int64 `json:"memFreeBytes"`
	CachedBytes  int64 `json:"cachedBytes"`
	// PagesIn and PagesOut are KiB read from and written to disk so far;
	// MajorFaults page faults that needed a read.
	PagesIn     int64 `json:"pagesInKiB"`
	PagesOut    int64 `json:"pagesOutKiB"`
	MajorFaults int64 `json:"majorFaults"`
}

// TableSample is one table's size and upkeep (pg_stat_user_tables).
type TableSample struct {
	Name        string `json:"name"`
	LiveRows    int64  `json:"liveRows"`
	DeadRows    int64  `json:"deadRows"`
	TableBytes  int64  `json:"tableBytes"`
	IndexBytes  int64  `json:"indexBytes"`
	Autovacuums int64  `json:"autovacuums"`
	Autoanalyze int64  `json:"autoanalyzes"`
	SeqScans    int64  `json:"seqScans"`
	SeqTupRead  int64  `json:"seqTupRead"`
	Inserts     int64  `json:"inserts"`
	Updates     int64  `json:"updates"`
	HotUpdates  int64  `json:"hotUpdates"`
	Deletes     int64  `json:"deletes"`
}

// IndexSample is one index's size and use (pg_stat_user_indexes).
type IndexSample struct {
	Table   string `json:"table"`
	Name    string `json:"name"`
	Bytes   int64  `json:"bytes"`
	Scans   int64  `json:"scans"`
	TupRead int64  `json:"tupRead"`
}

// PostgresSample is the server's own counters.
type PostgresSample struct {
	CheckpointsTimed  int64 `json:"checkpointsTimed"`
	CheckpointsReq    int64 `json:"checkpointsReq"`
	BuffersCheckpoint int64 `json:"buffersCheckpoint"`
	BuffersBackend    int64 `json:"buffersBackend"`
	WALBytes          int64 `json:"walBytes"`
	// DataBytes is every database's size plus the WAL.
	DataBytes int64 `json:"dataBytes"`
	// Autovacuum workers running at the sample.
	AutovacuumsRunning int64 `json:"autovacuumsRunning"`
	// CPUSeconds is the CPU time of the server and its processes so far
	// (the postmaster's, its children's and its exited children's).
	CPUSeconds float64 `json:"cpuSeconds"`
}

// ProviderSample is the provider simulator's state.
type ProviderSample struct {
	RSSBytes   int64   `json:"rssBytes"`
	DataBytes  int64   `json:"dataBytes"` // its data file
	CPUSeconds float64 `json:"cpuSeconds"`
}

// soakSampler reads the cluster's state.
type soakSampler struct {
	c      *cluster.Cluster
	client *http.Client
	conns  map[string]*pgx.Conn // region -> connection
}

func newSoakSampler(c *cluster.Cluster) *soakSampler {
	tr := &http.Transport{TLSClientConfig: c.ClientTLS(), MaxIdleConnsPerHost: 1}
	return &soakSampler{c: c, client: &http.Client{Transport: tr, Timeout: 5 * time.Second}, conns: map[string]*pgx.Conn{}}
}

func (s *soakSampler) close() {
	for _, conn := range s.conns {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = conn.Close(ctx)
		cancel()
	}
	s.client.CloseIdleConnections()
}

// sample fills in everything but the traffic.
func (s *soakSampler) sample(ctx context.Context, out *SoakSample) {
	for _, p := range s.c.Nodes() {
		ns, err := s.node(ctx, p)
		if err != nil {
			out.Errs = append(out.Errs, fmt.Sprintf("node %s: %v", p.Name(), err))
		}
		out.Nodes = append(out.Nodes, ns)
	}
	info := s.c.Info()
	for _, r := range info.Regions {
		st, err := s.store(ctx, r.Name, r.DatabaseURL)
		if err != nil {
			out.Errs = append(out.Errs, fmt.Sprintf("store %s: %v", r.Name, err))
			continue
		}
		out.Stores = append(out.Stores, st)
	}
	if len(info.Regions) > 0 {
		pg, err := s.postgres(ctx, info.Regions[0].Name)
		if err != nil {
			out.Errs = append(out.Errs, fmt.Sprintf("postgres: %v", err))
		} else {
			for _, st := range out.Stores {
				pg.DataBytes += st.DatabaseBytes
			}
			pg.DataBytes += pg.WALBytes
			if pid := s.c.PostgresPid(); pid > 0 {
				pg.CPUSeconds = cpuOf(pid, true)
				for _, child := range procfs.Children(pid) {
					pg.CPUSeconds += cpuOf(child, false)
				}
			}
			out.Postgres = pg
		}
	}
	if p := s.c.Provider(); p != nil {
		ps := &ProviderSample{RSSBytes: rssOf(p.Pid()), CPUSeconds: cpuOf(p.Pid(), false)}
		if fi, err := os.Stat(filepath.Join(s.c.StateDir(), "provider", simulator.DataFileName)); err == nil {
			ps.DataBytes = fi.Size()
		} else {
			out.Errs = append(out.Errs, fmt.Sprintf("provider data file: %v", err))
		}
		out.Provider = ps
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		out.Load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	out.Machine = machineSample()
}

// machineSample reads /proc/meminfo and /proc/vmstat; nil when neither
// can be read.
func machineSample() *MachineSample {
	mem, errMem := procFields("/proc/meminfo")
	vm, errVM := procFields("/proc/vmstat")
	if errMem != nil && errVM != nil {
		return nil
	}
	return &MachineSample{
		MemFreeBytes: mem["MemFree:"] * 1024,
		CachedBytes:  mem["Cached:"] * 1024,
		PagesIn:      vm["pgpgin"],
		PagesOut:     vm["pgpgout"],
		MajorFaults:  vm["pgmajfault"],
	}
}

// procFields reads a /proc file of "name value [unit]" lines.
func procFields(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			out[f[0]] = v
		}
	}
	return out, nil
}

// node scrapes one node's /metrics.
func (s *soakSampler) node(ctx context.Context, p *cluster.Process) (NodeSample, error) {
	ns := NodeSample{Name: p.Name()}
	if !p.Running() {
		return ns, errors.New("not running")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL()+"/metrics", nil)
	if err != nil {
		return ns, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return ns, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ns, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	m, err := parseMetrics(resp.Body)
	if err != nil {
		return ns, err
	}
	ns.StartTime = m["process_start_time_seconds"]
	ns.RSSBytes = m["process_resident_memory_bytes"]
	ns.HeapBytes = m["go_memstats_heap_inuse_bytes"]
	ns.Goroutines = m["go_goroutines"]
	ns.OpenFDs = m["process_open_fds"]
	ns.PoolTotal = m["idem_pgxpool_total_conns"]
	ns.PoolAcquired = m["idem_pgxpool_acquired_conns"]
	ns.PoolMax = m["idem_pgxpool_max_conns"]
	ns.CPUSeconds = m["process_cpu_seconds_total"]
	return ns, nil
}

// parseMetrics reads the unlabelled samples of a Prometheus text
// exposition (name value).
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		out[f[0]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

// rssOf returns a process's resident set from /proc (0 if unknown).
func rssOf(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// cpuOf returns a process's CPU time (user and system) from /proc, with its
// reaped children's if withChildren (0 if unknown).
func cpuOf(pid int, withChildren bool) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0
	}
	fields := []int{11, 12} // utime, stime
	if withChildren {
		fields = append(fields, 13, 14) // cutime, cstime
	}
	var ticks int64
	for _, j := range fields {
		v, _ := strconv.ParseInt(f[j], 10, 64)
		ticks += v
	}
	return float64(ticks) / clockTicks
}

func (s *soakSampler) conn(ctx context.Context, region, url string) (*pgx.Conn, error) {
	if c := s.conns[region]; c != nil && !c.IsClosed() {
		return c, nil
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	s.conns[region] = c
	return c, nil
}

// drop forgets a connection after an error, so the next sample dials anew.
func (s *soakSampler) drop(region string) {
	if c := s.conns[region]; c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.Close(ctx)
		cancel()
	}
	delete(s.conns, region)
}

// store reads one region's database: table and index sizes and upkeep,
// and the backlogs.
func (s *soakSampler) store(ctx context.Context, region, url string) (StoreSample, error) {
	st := StoreSample{Region: region}
	conn, err := s.conn(ctx, region, url)
	if err != nil {
		return st, err
	}
	err = func() error {
		rows, err := conn.Query(ctx, `SELECT s.relname, s.n_live_tup, s.n_dead_tup, pg_table_size(s.relid), pg_indexes_size(s.relid),
				s.autovacuum_count, s.autoanalyze_count, COALESCE(s.seq_scan, 0), COALESCE(s.seq_tup_read, 0),
				s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del
			FROM pg_stat_user_tables AS s ORDER BY s.relname`)
		if err != nil {
			return fmt.Errorf("tables: %w", err)
		}
		for rows.Next() {
			var t TableSample
			if err := rows.Scan(&t.Name, &t.LiveRows, &t.DeadRows, &t.TableBytes, &t.IndexBytes, &t.Autovacuums, &t.Autoanalyze,
				&t.SeqScans, &t.SeqTupRead, &t.Inserts, &t.Updates, &t.HotUpdates, &t.Deletes); err != nil {
				rows.Close()
				return fmt.Errorf("tables: %w", err)
			}
			if t.Name == "idempotency_records" {
				st.Records = t.LiveRows
			}
			st.Tables = append(st.Tables, t)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("tables: %w", err)
		}
		rows, err = conn.Query(ctx, `SELECT relname, indexrelname, pg_relation_size(indexrelid), idx_scan, idx_tup_read
			FROM pg_stat_user_indexes ORDER BY relname, indexrelname`)
		if err != nil {
			return fmt.Errorf("indexes: %w", err)
		}
		for rows.Next() {
			var ix IndexSample
			if err := rows.Scan(&ix.Table, &ix.Name, &ix.Bytes, &ix.Scans, &ix.TupRead); err != nil {
				rows.Close()
				return fmt.Errorf("indexes: %w", err)
			}
			st.Indexes = append(st.Indexes, ix)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("indexes: %w", err)
		}
		// The backlogs walk partial indexes of only the open rows.
		return conn.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM outbox_events WHERE published_at IS NULL),
				(SELECT count(*) FROM queue_messages WHERE processed_at IS NULL),
				(SELECT count(*) FROM email_notifications WHERE sent_at IS NULL),
				pg_database_size(current_database()),
				(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
				(SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()),
				(SELECT blks_read FROM pg_stat_database WHERE datname = current_database()),
				(SELECT blks_hit FROM pg_stat_database WHERE datname = current_database())`).
			Scan(&st.OutboxBacklog, &st.QueuePending, &st.EmailsUnsent, &st.DatabaseBytes, &st.Commits, &st.Rollbacks,
				&st.BlocksRead, &st.BlocksHit)
	}()
	if err != nil {
		s.drop(region)
		return st, err
	}
	return st, nil
}

// postgres reads the server's counters through region's connection.
func (s *soakSampler) postgres(ctx context.Context, region string) (*PostgresSample, error) {
	conn := s.conns[region]
	if conn == nil {
		return nil, errors.New("no connection")
	}
	pg := &PostgresSample{}
	if err := conn.QueryRow(ctx, `SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint, buffers_backend FROM pg_stat_bgwriter`).
		Scan(&pg.CheckpointsTimed, &pg.CheckpointsReq, &pg.BuffersCheckpoint, &pg.BuffersBackend); err != nil {
		s.drop(region)
		return nil, fmt.Errorf("pg_stat_bgwriter: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'`).
		Scan(&pg.AutovacuumsRunning); err != nil {
		s.drop(region)
		return nil, fmt.Errorf("pg_stat_activity: %w", err)
	}
	// pg_ls_waldir needs a superuser or pg_monitor; without, WALBytes stays 0.
	_ = conn.QueryRow(ctx, `SELECT COALESCE(sum(size), 0)::BIGINT FROM pg_ls_waldir()`).Scan(&pg.WALBytes)
	return pg, nil
}
