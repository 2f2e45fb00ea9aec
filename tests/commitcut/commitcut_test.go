package commitcut

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// msg frames a protocol message of type t with body.
func msg(t byte, body string) string { return string(frame(t, []byte(body))) }

func complete(tag string) string { return msg('C', tag+"\x00") }
func ready(status string) string { return msg('Z', status) }
func queryMsg(sql string) string { return msg('Q', sql+"\x00") }
func rowDesc(column string) string {
	return msg('T', "\x00\x01"+column+"\x00"+strings.Repeat("\x00", 18))
}
func parse(name, sql string) string { return msg('P', name+"\x00"+sql+"\x00\x00\x00") }
func bind(portal, stmt string) string {
	return msg('B', portal+"\x00"+stmt+"\x00\x00\x00\x00\x00\x00\x00")
}
func execute(portal string) string { return msg('E', portal+"\x00\x00\x00\x00\x00") }
func syncMsg() string              { return msg('S', "") }

// startup is a StartupMessage (protocol 3.0, user u).
func startup() string {
	body := "\x00\x03\x00\x00user\x00u\x00\x00"
	b := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(b, uint32(4+len(body)))
	return string(append(b, body...))
}

// armed is a Cut with no proxy, armed with f for its first occurrence.
func armed(f Fault) *Cut {
	c := &Cut{done: make(chan struct{}), stormQuiet: make(chan struct{})}
	c.ArmFault(f, 1)
	return c
}

// down feeds the server's chunks to one connection's downstream reader.
func down(c *Cut, chunks ...string) (string, bool) {
	st := &downState{}
	var out []byte
	for _, ch := range chunks {
		o, closed := st.feed(c, []byte(ch))
		out = append(out, o...)
		if closed {
			return string(out), true
		}
	}
	return string(out), false
}

// up feeds the client's chunks, after its startup message, to one
// connection's upstream reader.
func up(c *Cut, chunks ...string) string {
	st := &upState{startup: true}
	out := st.feed(c, []byte(startup()))
	for _, ch := range chunks {
		out = append(out, st.feed(c, []byte(ch))...)
	}
	return strings.TrimPrefix(string(out), startup())
}

// TestCommitAnswers: what the proxy counts as a commit's answer.
func TestCommitAnswers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		chunk string
		want  bool
	}{
		{"COMMIT", complete("COMMIT") + ready("I"), true},
		{"batch: BEGIN, a write, COMMIT", msg('2', "") + complete("BEGIN") + msg('2', "") + complete("INSERT 0 1") + msg('2', "") + complete("COMMIT") + ready("I"), true},
		{"implicit insert", msg('1', "") + msg('2', "") + msg('D', "row") + complete("INSERT 0 1") + ready("I"), true},
		{"implicit update", complete("UPDATE 1") + ready("I"), true},
		{"implicit delete", complete("DELETE 12") + ready("I"), true},
		{"insert inside a transaction", complete("INSERT 0 1") + ready("T"), false},
		{"insert that wrote nothing", complete("INSERT 0 0") + ready("I"), false},
		{"update that matched nothing", complete("UPDATE 0") + ready("I"), false},
		{"implicit select of a row (SELECT version() on a new connection)", complete("SELECT 1") + ready("I"), false},
		{"select inside a transaction", complete("SELECT 1") + ready("T"), false},
		{"release savepoint", complete("RELEASE") + ready("T"), false},
		{"rollback", complete("ROLLBACK") + ready("I"), false},
		{"write answer split from its ReadyForQuery", complete("UPDATE 1"), false},
		{"truncated", complete("COMMIT")[:6], false},
	} {
		c := armed(CutCommit)
		out, closed := down(c, tc.chunk)
		if closed != tc.want || c.Cut() != tc.want {
			t.Errorf("%s: cut = %v (closed %v), want %v", tc.name, c.Cut(), closed, tc.want)
		}
		if !tc.want && out != tc.chunk && tc.name != "write answer split from its ReadyForQuery" && tc.name != "truncated" {
			t.Errorf("%s: passed on %q, want it unchanged", tc.name, out)
		}
	}
}

// TestCutCommitKeepsWhatCameBefore: the answers before the commit's reach
// the client, the commit's and everything after it do not.
func TestCutCommitKeepsWhatCameBefore(t *testing.T) {
	c := armed(CutCommit)
	before := complete("BEGIN") + ready("T")
	out, closed := down(c, before+complete("COMMIT")+ready("I"))
	if !closed || out != before {
		t.Fatalf("out = %q closed %v, want %q and the connection closed", out, closed, before)
	}
}

// TestAmbiguousCommitAnswer: the COMMIT's CommandComplete becomes an
// ErrorResponse 40003, and ReadyForQuery keeps the server's idle status;
// answers split across chunks (here byte by byte) are read whole.
func TestAmbiguousCommitAnswer(t *testing.T) {
	server := msg('2', "") + complete("BEGIN") + msg('2', "") + complete("INSERT 0 1") + msg('2', "") + complete("COMMIT") + ready("I")
	want := msg('2', "") + complete("BEGIN") + msg('2', "") + complete("INSERT 0 1") + msg('2', "") + string(ambiguousAnswer()) + ready("I")
	for name, chunks := range map[string][]string{"whole": {server}, "byte by byte": strings.Split(server, "")} {
		c := armed(AmbiguousCommit)
		out, closed := down(c, chunks...)
		if closed || out != want || !c.Cut() {
			t.Errorf("%s: out = %q closed %v done %v, want %q", name, out, closed, c.Cut(), want)
		}
	}
	// An implicit transaction's write: its CommandComplete is the commit.
	c := armed(AmbiguousCommit)
	out, _ := down(c, msg('D', "row")+complete("INSERT 0 1")+ready("I"))
	if want := msg('D', "row") + string(ambiguousAnswer()) + ready("I"); out != want {
		t.Errorf("implicit insert: out = %q, want %q", out, want)
	}
}

// TestNthCommit: only the armed occurrence is hit, and only once.
func TestNthCommit(t *testing.T) {
	c := &Cut{done: make(chan struct{}), stormQuiet: make(chan struct{})}
	c.ArmFault(AmbiguousCommit, 2)
	answer := complete("COMMIT") + ready("I")
	st := &downState{}
	var got []string
	for range 3 {
		out, _ := st.feed(c, []byte(answer))
		got = append(got, string(out))
	}
	if got[0] != answer || got[1] != string(ambiguousAnswer())+ready("I") || got[2] != answer {
		t.Errorf("answers = %q, want the second one ambiguous", got)
	}
}

// TestRelease: the armed RELEASE SAVEPOINT is sent with a COMMIT (the
// server commits there, as CockroachDB does) behind a marker, and its
// answers become 40003 in a failed transaction, or a closed connection.
func TestRelease(t *testing.T) {
	release := queryMsg("RELEASE SAVEPOINT cockroach_restart")
	for _, tc := range []struct {
		f      Fault
		marker string
	}{{AmbiguousRelease, markerAmbiguousRelease}, {CutRelease, markerCutRelease}} {
		c := armed(tc.f)
		sent := up(c, queryMsg("SAVEPOINT cockroach_restart"), release)
		want := queryMsg("SAVEPOINT cockroach_restart") + queryMsg("SELECT 1 AS "+tc.marker+"; RELEASE SAVEPOINT cockroach_restart; COMMIT")
		if sent != want || !c.Cut() {
			t.Errorf("%s: sent %q, want %q", tc.f, sent, want)
		}
		server := rowDesc(tc.marker) + msg('D', "\x00\x01\x00\x00\x00\x011") + complete("SELECT 1") + complete("RELEASE") + complete("COMMIT") + ready("I")
		out, closed := down(c, server)
		switch tc.f {
		case AmbiguousRelease:
			if closed || out != string(ambiguousAnswer())+ready("E") {
				t.Errorf("%s: client got %q closed %v, want 40003 and a failed transaction", tc.f, out, closed)
			}
		case CutRelease:
			if !closed || out != "" {
				t.Errorf("%s: client got %q closed %v, want nothing and the connection closed", tc.f, out, closed)
			}
		}
	}
	// Unarmed, and a COMMIT fault: RELEASE goes through unchanged.
	for _, c := range []*Cut{{done: make(chan struct{})}, armed(AmbiguousCommit)} {
		if sent := up(c, release); sent != release {
			t.Errorf("sent %q, want RELEASE unchanged", sent)
		}
	}
}

// TestStorm: the statements a storm takes are replaced with one that the
// server fails with 40001 (a COMMIT's rolls back first); in an extended
// request, the whole request up to its Sync is; the run ends after n.
func TestStorm(t *testing.T) {
	c := &Cut{done: make(chan struct{}), stormQuiet: make(chan struct{})}
	quiet := c.Storm("release savepoint", 2)
	release := queryMsg("RELEASE SAVEPOINT cockroach_restart")
	sent := up(c, release, queryMsg("ROLLBACK TO SAVEPOINT cockroach_restart"), release, release)
	want := queryMsg(raiseRetry) + queryMsg("ROLLBACK TO SAVEPOINT cockroach_restart") + queryMsg(raiseRetry) + release
	if sent != want {
		t.Errorf("sent %q, want %q", sent, want)
	}
	select {
	case <-quiet:
	default:
		t.Error("the storm of 2 did not end")
	}
	if c.Stormed() != 2 {
		t.Errorf("stormed %d, want 2", c.Stormed())
	}

	c.Storm("COMMIT", -1)
	if sent := up(c, queryMsg("commit")); sent != queryMsg("ROLLBACK; "+raiseRetry) {
		t.Errorf("COMMIT sent as %q", sent)
	}
	prepare := parse("s1", "BEGIN") + parse("s2", "COMMIT") + msg('D', "Ss1\x00") + msg('D', "Ss2\x00") + syncMsg()
	run := bind("", "s1") + execute("") + bind("", "s2") + execute("") + syncMsg()
	st := &upState{startup: true}
	st.feed(c, []byte(startup()))
	if got := string(st.feed(c, []byte(prepare))); got != prepare {
		t.Errorf("a prepare request (nothing executed) sent as %q", got)
	}
	if got := string(st.feed(c, []byte(run))); got != queryMsg(raiseRetry) {
		t.Errorf("a batch that commits sent as %q, want the 40001 statement", got)
	}
	c.Storm("", 0)
	if got := string(st.feed(c, []byte(run))); got != run {
		t.Errorf("after the storm, the batch sent as %q", got)
	}
	if !bytes.Contains([]byte(raiseRetry), []byte("'40001'")) {
		t.Error("the storm statement does not raise 40001")
	}
}
