// Package failpoint lets tests and the chaos harness stop a real process at a
// named point of its code, the way etcd's gofail does, without a special
// build: the set of active failpoints is parsed from one string (the
// IDEM_FAILPOINTS environment variable of idemd) and injected into the code
// that evaluates them.
//
// Syntax: "name=action;name2=action". Actions: sleep(DURATION), e.g.
// "before-provider-call=sleep(5s)"; a count prefix limits how many times the
// action fires: "before-provider-call=1*sleep(5s)".
package failpoint

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Set is a set of active failpoints. The zero value and nil have none. It is
// safe for concurrent use.
type Set struct {
	mu     sync.Mutex
	points map[string]*point
}

type point struct {
	sleep time.Duration
	left  int // remaining firings; -1 = unlimited
}

// Parse parses a failpoint specification ("" gives an empty set).
func Parse(spec string) (*Set, error) {
	s := &Set{points: map[string]*point{}}
	for _, item := range strings.Split(spec, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, action, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("failpoint: %q is not name=action", item)
		}
		p := &point{left: -1}
		if n, rest, ok := strings.Cut(action, "*"); ok {
			count, err := strconv.Atoi(n)
			if err != nil || count < 1 {
				return nil, fmt.Errorf("failpoint: bad count in %q", item)
			}
			p.left, action = count, rest
		}
		arg, ok := strings.CutPrefix(action, "sleep(")
		if !ok || !strings.HasSuffix(arg, ")") {
			return nil, fmt.Errorf("failpoint: unknown action in %q (want sleep(DURATION))", item)
		}
		d, err := time.ParseDuration(strings.TrimSuffix(arg, ")"))
		if err != nil {
			return nil, fmt.Errorf("failpoint: %q: %w", item, err)
		}
		p.sleep = d
		s.points[strings.TrimSpace(name)] = p
	}
	return s, nil
}

// Eval runs the action of failpoint name, if it is active: it sleeps (until
// ctx is done). It returns at once for an inactive point or a nil Set.
func (s *Set) Eval(ctx context.Context, name string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	p, ok := s.points[name]
	if !ok || p.left == 0 {
		s.mu.Unlock()
		return
	}
	if p.left > 0 {
		p.left--
	}
	d := p.sleep
	s.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
