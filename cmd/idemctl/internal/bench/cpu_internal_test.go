package bench

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/idemcoord/idem/internal/storetest"
)

// TestPostgresProcess: the backends pg_stat_activity names for a server on
// this machine are taken for the server's, and their CPU is sampled; this
// process, pid 1 and a pid no process has are not (as the pids of a server
// in a container or elsewhere would name them here).
func TestPostgresProcess(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	// The pool's own connections: a worker of the database (autovacuum)
	// may exit between the query and the read of its /proc entry.
	rows, err := st.Pool().Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend'`)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(pids) == 0 {
		t.Fatal("pg_stat_activity names no backend of the test's database")
	}
	for _, pid := range pids {
		if !postgresProcess(strconv.Itoa(int(pid))) {
			t.Errorf("backend %d not taken for a PostgreSQL process", pid)
		}
	}
	for _, pid := range []string{strconv.Itoa(os.Getpid()), "1", "2147483647"} {
		if postgresProcess(pid) {
			t.Errorf("pid %s taken for a PostgreSQL process", pid)
		}
	}
	// sampleCPU reads every backend of the database, workers included: a
	// worker that exits mid-sample fails that sample alone, so a few are
	// allowed.
	var s cpuSample
	for range 5 {
		if s = sampleCPU(ctx, st); s.ok {
			break
		}
	}
	if !s.ok || s.client <= 0 {
		t.Errorf("sampleCPU on a local server = %+v, want ok with this process's CPU", s)
	}
}
