package simulator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/idemcoord/idem/provider"
)

// DataFileName is the name of the append-only JSON-lines file the simulator
// keeps in [Config.DataDir].
const DataFileName = "charges.jsonl"

// errStoreClosed is returned by store operations after close.
var errStoreClosed = errors.New("provider: store closed")

// recordKind names what a persisted line records.
type recordKind string

const (
	recordCharge  recordKind = "charge"
	recordDecline recordKind = "decline"
	recordToken   recordKind = "token"
)

// record is one line of the data file. Every kind may carry a new
// highest-seen fencing token for its key.
type record struct {
	Kind         recordKind       `json:"kind"`
	Key          string           `json:"key"`
	FencingToken *int64           `json:"fencingToken,omitempty"`
	Charge       *provider.Charge `json:"charge,omitempty"`
	Decline      *declineRecord   `json:"decline,omitempty"`
	At           time.Time        `json:"at"`
}

// declineRecord is a remembered business rejection of a key.
type declineRecord struct {
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	AccountID   string `json:"accountId,omitempty"`
	Message     string `json:"message"`
}

// chargeInput is a validated charge request.
type chargeInput struct {
	Key         string
	AmountMinor int64
	Currency    string
	AccountID   string
	Token       int64
	HasToken    bool
	Reference   string
}

// outcomeKind is the result of processing a charge request.
type outcomeKind int

const (
	outcomeCharged outcomeKind = iota
	outcomeReplayed
	outcomeDeclined
	outcomeDeclineReplayed
	outcomeStaleToken
	outcomeKeyReused
	outcomeStoreFailed
)

// outcome is what [store.charge] decided.
type outcome struct {
	kind    outcomeKind
	charge  provider.Charge
	decline declineRecord
	highest int64 // for outcomeStaleToken
	err     error // for outcomeStoreFailed
}

// store is the simulator's state: charges, declines and the highest fencing
// token per key. When file is non-nil every change is appended to it and
// fsync'ed before it becomes visible in memory.
type store struct {
	log *slog.Logger

	mu       sync.Mutex
	file     *os.File // nil: in-memory only
	size     int64    // length of the valid prefix of file
	broken   error    // set when the file could not be restored after a failed write
	closed   bool
	charges  map[string]provider.Charge
	declines map[string]declineRecord
	tokens   map[string]int64
	applied  map[string]int // charge applications per key
	total    int
}

func newMemStore(log *slog.Logger) *store {
	return &store{
		log:      log,
		charges:  make(map[string]provider.Charge),
		declines: make(map[string]declineRecord),
		tokens:   make(map[string]int64),
		applied:  make(map[string]int),
	}
}

// openStore loads the state persisted in dir, or returns an in-memory store
// when dir is empty.
func openStore(dir string, log *slog.Logger) (*store, error) {
	st := newMemStore(log)
	if dir == "" {
		return st, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("provider: create data dir: %w", err)
	}
	path := filepath.Join(dir, DataFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("provider: open data file: %w", err)
	}
	if err := syncDir(dir); err != nil {
		_ = f.Close()
		return nil, err
	}
	valid, err := st.load(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("provider: load %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("provider: stat data file: %w", err)
	}
	if info.Size() != valid {
		// A torn last line from a crash in the middle of a write: that
		// request was never answered, so dropping it is allowed.
		log.Warn("provider: truncating torn tail of data file", "path", path, "size", info.Size(), "valid", valid)
		if err := f.Truncate(valid); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("provider: truncate torn data file: %w", err)
		}
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("provider: sync data file: %w", err)
		}
	}
	st.file = f
	st.size = valid
	log.Info("provider: state loaded", "path", path, "charges", st.total, "declines", len(st.declines))
	return st, nil
}

// syncDir makes the creation of the data file durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("provider: open data dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("provider: sync data dir: %w", err)
	}
	return nil
}

// load replays the data file into memory. It returns the length of the valid
// prefix: a malformed final line (a torn write) is excluded; a malformed line
// followed by more data is corruption and an error.
func (st *store) load(r io.Reader) (int64, error) {
	br := bufio.NewReader(r)
	var offset int64
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			// len(b) > 0: a final line without its newline is a torn write.
			return offset, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read: %w", err)
		}
		trimmed := bytes.TrimSpace(b)
		if len(trimmed) > 0 {
			var rec record
			if err := json.Unmarshal(trimmed, &rec); err != nil || rec.Key == "" {
				if _, peekErr := br.Peek(1); errors.Is(peekErr, io.EOF) {
					return offset, nil // torn last line
				}
				if err == nil {
					err = errors.New("record without key")
				}
				return 0, fmt.Errorf("line %d: %w", line, err)
			}
			if err := st.apply(rec); err != nil {
				return 0, fmt.Errorf("line %d: %w", line, err)
			}
		}
		offset += int64(len(b))
	}
}

// apply updates memory with a persisted record. Callers hold mu or own st.
func (st *store) apply(rec record) error {
	if rec.FencingToken != nil {
		if cur, ok := st.tokens[rec.Key]; !ok || *rec.FencingToken > cur {
			st.tokens[rec.Key] = *rec.FencingToken
		}
	}
	switch rec.Kind {
	case recordCharge:
		if rec.Charge == nil {
			return errors.New("charge record without charge")
		}
		if _, ok := st.charges[rec.Key]; !ok {
			st.charges[rec.Key] = *rec.Charge
		}
		// Count every application: a double charge must show up as 2.
		st.applied[rec.Key]++
		st.total++
	case recordDecline:
		if rec.Decline == nil {
			return errors.New("decline record without decline")
		}
		if _, ok := st.declines[rec.Key]; !ok {
			st.declines[rec.Key] = *rec.Decline
		}
	case recordToken:
		if rec.FencingToken == nil {
			return errors.New("token record without token")
		}
	default:
		return fmt.Errorf("unknown record kind %q", rec.Kind)
	}
	return nil
}

// persistLocked appends rec to the data file and fsyncs it, then applies it
// to memory. On a write failure the file is cut back to its last valid length
// so that nothing of a failed request survives a restart. Callers hold mu.
func (st *store) persistLocked(rec record) error {
	if st.closed {
		return errStoreClosed
	}
	if st.broken != nil {
		return fmt.Errorf("provider: storage unusable: %w", st.broken)
	}
	if st.file != nil {
		b, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("provider: encode record: %w", err)
		}
		b = append(b, '\n')
		_, err = st.file.Write(b)
		if err == nil {
			err = st.file.Sync()
		}
		if err != nil {
			if terr := st.file.Truncate(st.size); terr != nil {
				st.broken = errors.Join(err, terr)
			}
			return fmt.Errorf("provider: persist record: %w", err)
		}
		st.size += int64(len(b))
	}
	return st.apply(rec)
}

// charge processes one charge request atomically: fencing check, idempotent
// replay, key reuse detection, then a decline or a new charge. decline says a
// decline fault is active for this request.
func (st *store) charge(in chargeInput, decline bool, now time.Time) outcome {
	st.mu.Lock()
	defer st.mu.Unlock()

	if st.closed {
		return outcome{kind: outcomeStoreFailed, err: errStoreClosed}
	}

	// Fencing: lower than the highest seen is stale; equal or higher is
	// accepted and (when higher, or first) raises the highest seen.
	var raise *int64
	if in.HasToken {
		cur, seen := st.tokens[in.Key]
		if seen && in.Token < cur {
			return outcome{kind: outcomeStaleToken, highest: cur}
		}
		if !seen || in.Token > cur {
			tok := in.Token
			raise = &tok
		}
	}
	// raiseOnly persists a raised token for requests that apply nothing else.
	raiseOnly := func(o outcome) outcome {
		if raise == nil {
			return o
		}
		if err := st.persistLocked(record{Kind: recordToken, Key: in.Key, FencingToken: raise, At: now}); err != nil {
			return outcome{kind: outcomeStoreFailed, err: err}
		}
		return o
	}

	if ch, ok := st.charges[in.Key]; ok {
		if ch.AmountMinor != in.AmountMinor || ch.Currency != in.Currency {
			return raiseOnly(outcome{kind: outcomeKeyReused, charge: ch})
		}
		return raiseOnly(outcome{kind: outcomeReplayed, charge: ch})
	}
	if d, ok := st.declines[in.Key]; ok {
		if d.AmountMinor != in.AmountMinor || d.Currency != in.Currency {
			return raiseOnly(outcome{kind: outcomeKeyReused, decline: d})
		}
		return raiseOnly(outcome{kind: outcomeDeclineReplayed, decline: d})
	}

	if decline {
		d := declineRecord{
			AmountMinor: in.AmountMinor,
			Currency:    in.Currency,
			AccountID:   in.AccountID,
			Message:     "the payment was declined by the provider",
		}
		if err := st.persistLocked(record{Kind: recordDecline, Key: in.Key, FencingToken: raise, Decline: &d, At: now}); err != nil {
			return outcome{kind: outcomeStoreFailed, err: err}
		}
		return outcome{kind: outcomeDeclined, decline: d}
	}

	ch := provider.Charge{
		ChargeID:    ChargeIDFor(in.Key),
		ProviderKey: in.Key,
		Status:      provider.StatusConfirmed,
		AmountMinor: in.AmountMinor,
		Currency:    in.Currency,
		AccountID:   in.AccountID,
		Reference:   in.Reference,
		CreatedAt:   now.UTC(),
	}
	if err := st.persistLocked(record{Kind: recordCharge, Key: in.Key, FencingToken: raise, Charge: &ch, At: now}); err != nil {
		return outcome{kind: outcomeStoreFailed, err: err}
	}
	return outcome{kind: outcomeCharged, charge: ch}
}

// lookup returns the charge applied for key, if any.
func (st *store) lookup(key string) (provider.Charge, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ch, ok := st.charges[key]
	return ch, ok
}

// counts returns how many charges were applied, in total and per key.
func (st *store) counts() provider.ChargeCounts {
	st.mu.Lock()
	defer st.mu.Unlock()
	c := provider.ChargeCounts{Total: st.total, ByKey: make(map[string]int, len(st.applied))}
	for k, n := range st.applied {
		c.ByKey[k] = n
	}
	return c
}

// close closes the data file; later operations fail with errStoreClosed.
func (st *store) close() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil
	}
	st.closed = true
	if st.file == nil {
		return nil
	}
	if err := st.file.Close(); err != nil {
		return fmt.Errorf("provider: close data file: %w", err)
	}
	return nil
}
