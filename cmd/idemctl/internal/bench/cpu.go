package bench

import (
	"context"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/idemcoord/idem/store"
)

// cpuSample is CPU time used so far by this process and by the database
// server's backends serving the benchmark's database.
type cpuSample struct {
	client, server time.Duration
	ok             bool
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on every
// Linux platform Go supports).
const clockTicks = 100

// procCPU returns the user+system CPU time of pid from /proc (Linux).
func procCPU(pid string) (time.Duration, bool) {
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15 of the line, 12 and 13 after the name.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+k) * time.Second / clockTicks, true
}

// postgresProcess reports whether pid names, on this machine, a PostgreSQL
// server process: its title (/proc/<pid>/cmdline) starts "postgres:" (the
// title a backend sets) or its program is named postgres (a backend with
// update_process_title off keeps the server's command line).
// pg_stat_activity gives pids in the server's own pid namespace: a server
// in a container or on another machine gives pids that here may name any
// process at all, whose CPU time is not the server's.
func postgresProcess(pid string) bool {
	raw, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil {
		return false
	}
	arg0, _, _ := strings.Cut(string(raw), "\x00")
	return strings.HasPrefix(arg0, "postgres:") || path.Base(arg0) == "postgres"
}

// sampleCPU reads this process's CPU time and that of every backend
// connected to st's database. It works only when the server's processes
// are this machine's (Linux, the same pid namespace); otherwise ok is false
// and the figures are left out.
func sampleCPU(ctx context.Context, st *store.Store) cpuSample {
	self, ok := procCPU("self")
	if !ok {
		return cpuSample{}
	}
	rows, err := st.Pool().Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return cpuSample{}
	}
	defer rows.Close()
	var server time.Duration
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			return cpuSample{}
		}
		p := strconv.Itoa(int(pid))
		if !postgresProcess(p) {
			return cpuSample{}
		}
		d, ok := procCPU(p)
		if !ok {
			return cpuSample{}
		}
		server += d
	}
	if rows.Err() != nil {
		return cpuSample{}
	}
	return cpuSample{client: self, server: server, ok: true}
}
