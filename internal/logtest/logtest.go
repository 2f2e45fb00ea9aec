// Package logtest holds a slog handler for tests that assert what a
// component logged.
package logtest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Messages is a slog handler that keeps every record's message (attributes
// and groups are dropped). It is safe for concurrent use.
type Messages struct {
	mu   sync.Mutex
	msgs []string
}

// Enabled implements slog.Handler: every level is kept.
func (l *Messages) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (l *Messages) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}

// WithAttrs implements slog.Handler.
func (l *Messages) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler.
func (l *Messages) WithGroup(string) slog.Handler { return l }

// Has reports whether a message containing s was logged.
func (l *Messages) Has(s string) bool { return l.Count(s) > 0 }

// Count is how many messages containing s were logged.
func (l *Messages) Count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}
