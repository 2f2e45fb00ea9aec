package commitcut

import (
	"encoding/binary"
	"testing"
)

// msg frames a backend message of type t with body.
func msg(t byte, body string) string {
	b := make([]byte, 5, 5+len(body))
	b[0] = t
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return string(append(b, body...))
}

func TestIsCommit(t *testing.T) {
	complete := func(tag string) string { return msg('C', tag+"\x00") }
	ready := func(status string) string { return msg('Z', status) }
	for _, tc := range []struct {
		name  string
		chunk string
		want  bool
	}{
		{"COMMIT", complete("COMMIT") + ready("I"), true},
		{"implicit insert", msg('1', "") + msg('2', "") + msg('D', "row") + complete("INSERT 0 1") + ready("I"), true},
		{"implicit update", complete("UPDATE 1") + ready("I"), true},
		{"implicit delete", complete("DELETE 12") + ready("I"), true},
		{"insert inside a transaction", complete("INSERT 0 1") + ready("T"), false},
		{"insert that wrote nothing", complete("INSERT 0 0") + ready("I"), false},
		{"update that matched nothing", complete("UPDATE 0") + ready("I"), false},
		{"implicit select of a row (a claim that inserts in WITH)", complete("SELECT 1") + ready("I"), true},
		{"select of no row", complete("SELECT 0") + ready("I"), false},
		{"select inside a transaction", complete("SELECT 1") + ready("T"), false},
		{"release savepoint", complete("RELEASE") + ready("T"), false},
		{"rollback", complete("ROLLBACK") + ready("I"), false},
		{"write answer split from its ReadyForQuery", complete("UPDATE 1"), false},
		{"truncated", complete("UPDATE 1")[:6], false},
	} {
		if got := isCommit([]byte(tc.chunk)); got != tc.want {
			t.Errorf("%s: isCommit = %v, want %v", tc.name, got, tc.want)
		}
	}
}
