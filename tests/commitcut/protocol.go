package commitcut

import (
	"bytes"
	"encoding/binary"
	"strings"
)

// SQLSTATEs the proxy answers with.
const (
	// codeAmbiguous is CockroachDB's "result is ambiguous" (PostgreSQL's
	// statement_completion_unknown).
	codeAmbiguous = "40003"
	// codeRetry is a serialization failure: restart the transaction.
	codeRetry = "40001"
)

// raiseRetry is what a storm's statements are replaced with: the server
// fails it with 40001, which aborts the transaction it is in.
const raiseRetry = `DO $$BEGIN RAISE EXCEPTION 'restart transaction: a 40001 storm of the fault proxy' USING ERRCODE = '` + codeRetry + `'; END$$`

// The column names of the statement that marks a rewritten RELEASE: the
// downstream toxic recognises the answer by its RowDescription.
const (
	markerAmbiguousRelease = "idem_commitcut_ambiguous_release"
	markerCutRelease       = "idem_commitcut_cut_release"
)

// Untyped startup-phase request codes.
const (
	cancelRequestCode = 80877102
	sslRequestCode    = 80877103
	gssRequestCode    = 80877104
)

// frame builds a protocol message of type typ with body.
func frame(typ byte, body []byte) []byte {
	m := make([]byte, 5, 5+len(body))
	m[0] = typ
	binary.BigEndian.PutUint32(m[1:], uint32(4+len(body)))
	return append(m, body...)
}

// next takes the first whole message off *buf (type byte, length, body).
func next(buf *[]byte) ([]byte, bool) {
	b := *buf
	if len(b) < 5 {
		return nil, false
	}
	n := int(binary.BigEndian.Uint32(b[1:5]))
	if n < 4 || len(b) < 1+n {
		return nil, false
	}
	m := bytes.Clone(b[:1+n])
	*buf = b[1+n:]
	return m, true
}

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

// errorResponse is an ErrorResponse with SQLSTATE code and message msg.
func errorResponse(code, msg string) []byte {
	var b []byte
	for _, f := range []struct {
		t byte
		v string
	}{{'S', "ERROR"}, {'V', "ERROR"}, {'C', code}, {'M', msg}} {
		b = append(b, f.t)
		b = append(b, f.v...)
		b = append(b, 0)
	}
	return frame('E', append(b, 0))
}

// readyForQuery is ReadyForQuery with transaction status st: 'I' idle,
// 'T' in a transaction block, 'E' in a failed one.
func readyForQuery(st byte) []byte { return frame('Z', []byte{st}) }

// query is a simple-protocol Query message.
func query(sql string) []byte { return frame('Q', append([]byte(sql), 0)) }

// ambiguousAnswer is CockroachDB's answer to a commit whose outcome it
// cannot tell.
func ambiguousAnswer() []byte {
	return errorResponse(codeAmbiguous, "result is ambiguous: the fault proxy swallowed the server's answer (the server committed)")
}

// normalize is sql as the proxy compares statements: trimmed, without a
// final semicolon, blanks collapsed, upper case.
func normalize(sql string) string {
	return strings.ToUpper(strings.Join(strings.Fields(strings.TrimSuffix(strings.TrimSpace(sql), ";")), " "))
}

func hasPrefixFold(norm, prefix string) bool { return strings.HasPrefix(norm, prefix) }

// isCommitStatement reports whether normalised sql commits the
// transaction block.
func isCommitStatement(norm string) bool {
	switch norm {
	case "COMMIT", "COMMIT WORK", "COMMIT TRANSACTION", "END", "END WORK", "END TRANSACTION":
		return true
	}
	return false
}

// isCommitRelease reports whether normalised sql is cockroach-go's
// commit: RELEASE SAVEPOINT cockroach_restart.
func isCommitRelease(norm string) bool {
	return norm == "RELEASE SAVEPOINT COCKROACH_RESTART" || norm == "RELEASE COCKROACH_RESTART"
}

// writeTag reports whether a CommandComplete tag is a write of at least one
// row ("INSERT 0 1", "UPDATE 3", "DELETE 1").
func writeTag(tag string) bool {
	f := strings.Fields(tag)
	switch {
	case len(f) == 3 && f[0] == "INSERT":
		return f[2] != "0"
	case len(f) == 2 && (f[0] == "UPDATE" || f[0] == "DELETE"):
		return f[1] != "0"
	}
	return false
}

// markerFault is the fault a RowDescription's marker column names, 0
// when it has none.
func markerFault(rowDescription []byte) Fault {
	switch {
	case bytes.Contains(rowDescription, []byte(markerAmbiguousRelease+"\x00")):
		return AmbiguousRelease
	case bytes.Contains(rowDescription, []byte(markerCutRelease+"\x00")):
		return CutRelease
	}
	return 0
}

// downState reads one connection's server-to-client stream.
type downState struct {
	buf []byte
	// framed is set once a framed message went by: before it, the answer
	// to an SSLRequest or GSSENCRequest is a single unframed byte.
	framed bool
	// opaque: the stream went TLS; it is passed on untouched.
	opaque bool
	// held is a write's CommandComplete, kept until the next message
	// says whether it ended an implicit transaction (a commit).
	held []byte
	// swallow is a rewritten RELEASE's fault: its answers are dropped up
	// to ReadyForQuery, where the fault is done.
	swallow Fault
	// skip drops messages up to ReadyForQuery, which goes on (a COMMIT
	// answered 40003: nothing else of its request runs).
	skip bool
}

// feed takes data from the server and returns what the client gets, and
// whether the client's connection is then closed.
func (s *downState) feed(c *Cut, data []byte) ([]byte, bool) {
	if s.opaque {
		return data, false
	}
	s.buf = append(s.buf, data...)
	var out []byte
	for {
		if !s.framed && len(s.buf) > 0 && strings.IndexByte("NSG", s.buf[0]) >= 0 && (len(s.buf) == 1 || s.buf[1] != 0) {
			// Before any framed message (whose length starts with a zero
			// byte), this is the one-byte answer to an SSLRequest or a
			// GSSENCRequest.
			b := s.buf[0]
			out = append(out, b)
			s.buf = s.buf[1:]
			if b == 'S' || b == 'G' {
				s.opaque = true
				return append(out, s.buf...), false
			}
			continue
		}
		m, ok := next(&s.buf)
		if !ok {
			return out, false
		}
		s.framed = true
		emit, closeConn := s.message(c, m)
		out = append(out, emit...)
		if closeConn {
			return out, true
		}
	}
}

// message handles one server message m.
func (s *downState) message(c *Cut, m []byte) ([]byte, bool) {
	typ, body := m[0], m[5:]
	switch {
	case s.swallow != 0:
		if typ != 'Z' {
			return nil, false
		}
		f := s.swallow
		s.swallow = 0
		if f == CutRelease {
			return nil, true
		}
		// CockroachDB leaves the transaction to be rolled back.
		return append(ambiguousAnswer(), readyForQuery('E')...), false
	case s.skip:
		if typ != 'Z' {
			return nil, false
		}
		s.skip = false
		return m, false
	case s.held != nil:
		held := s.held
		s.held = nil
		if typ == 'Z' && len(body) == 1 && body[0] == 'I' {
			switch c.hit(false) {
			case CutCommit:
				return nil, true
			case AmbiguousCommit:
				return append(ambiguousAnswer(), m...), false
			}
			return append(held, m...), false
		}
		rest, closeConn := s.message(c, m)
		return append(held, rest...), closeConn
	}
	switch typ {
	case 'T':
		if f := markerFault(body); f != 0 {
			s.swallow = f
			return nil, false
		}
	case 'C':
		tag, _ := cstring(body)
		if tag == "COMMIT" {
			switch c.hit(false) {
			case CutCommit:
				return nil, true
			case AmbiguousCommit:
				s.skip = true
				return ambiguousAnswer(), false
			}
		} else if writeTag(tag) {
			s.held = m
			return nil, false
		}
	}
	return m, false
}

// upState reads one connection's client-to-server stream.
type upState struct {
	buf []byte
	// startup: the next message is an untyped startup-phase one.
	startup bool
	opaque  bool
	// stmts and portals name what prepared statements and portals run.
	stmts   map[string]string
	portals map[string]string
	// req holds an extended-protocol request (Parse, Bind, Describe,
	// Execute, Close) until its Sync or Flush, and reqSQL what it executes.
	req    []byte
	reqSQL []string
}

// feed takes data from the client and returns what the server gets.
func (s *upState) feed(c *Cut, data []byte) []byte {
	if s.opaque {
		return data
	}
	s.buf = append(s.buf, data...)
	var out []byte
	for {
		if s.startup {
			if len(s.buf) < 8 {
				return out
			}
			n := int(binary.BigEndian.Uint32(s.buf[:4]))
			if n < 8 {
				s.opaque = true
				return append(out, s.buf...)
			}
			if len(s.buf) < n {
				return out
			}
			switch binary.BigEndian.Uint32(s.buf[4:8]) {
			case sslRequestCode, gssRequestCode, cancelRequestCode:
				// Another untyped message follows, or nothing.
			default:
				s.startup = false
			}
			out = append(out, s.buf[:n]...)
			s.buf = s.buf[n:]
			continue
		}
		m, ok := next(&s.buf)
		if !ok {
			return out
		}
		out = append(out, s.message(c, m)...)
	}
}

// message handles one client message m.
func (s *upState) message(c *Cut, m []byte) []byte {
	if s.stmts == nil {
		s.stmts, s.portals = map[string]string{}, map[string]string{}
	}
	typ, body := m[0], m[5:]
	switch typ {
	case 'P': // Parse: statement name, query, parameter types
		name, rest := cstring(body)
		sql, _ := cstring(rest)
		s.stmts[name] = sql
	case 'B': // Bind: portal, statement, ...
		portal, rest := cstring(body)
		stmt, _ := cstring(rest)
		s.portals[portal] = s.stmts[stmt]
	case 'E': // Execute: portal, row limit
		portal, _ := cstring(body)
		s.reqSQL = append(s.reqSQL, s.portals[portal])
	case 'D', 'C': // Describe, Close
	case 'S': // Sync: the request is complete
		s.req = append(s.req, m...)
		return s.endRequest(c, true)
	case 'H': // Flush
		s.req = append(s.req, m...)
		return s.endRequest(c, false)
	case 'Q':
		sql, _ := cstring(body)
		return append(s.endRequest(c, false), s.query(c, sql, m)...)
	default:
		return append(s.endRequest(c, false), m...)
	}
	s.req = append(s.req, m...)
	return nil
}

// endRequest passes on the buffered extended-protocol request, or, at its
// Sync (sync true) when a storm takes a statement it executes, a Query
// that fails with 40001 in its place: the server answers ErrorResponse and
// ReadyForQuery, as it does when a request's first message fails.
func (s *upState) endRequest(c *Cut, sync bool) []byte {
	req, sqls := s.req, s.reqSQL
	s.req, s.reqSQL = nil, nil
	if sync {
		for _, sql := range sqls {
			if c.stormHit(normalize(sql)) {
				return query(raiseRetry)
			}
		}
	}
	return req
}

// query handles a simple-protocol Query m of sql.
func (s *upState) query(c *Cut, sql string, m []byte) []byte {
	norm := normalize(sql)
	if c.stormHit(norm) {
		if isCommitStatement(norm) {
			// A COMMIT that fails ends the transaction: rolled back.
			return query("ROLLBACK; " + raiseRetry)
		}
		return query(raiseRetry)
	}
	if isCommitRelease(norm) {
		switch c.hit(true) {
		case AmbiguousRelease:
			return query("SELECT 1 AS " + markerAmbiguousRelease + "; " + sql + "; COMMIT")
		case CutRelease:
			return query("SELECT 1 AS " + markerCutRelease + "; " + sql + "; COMMIT")
		}
	}
	return m
}
