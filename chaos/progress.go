package chaos

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// progress prints a line about a running scenario: elapsed time, calls,
// errors, the rate, the phase and the current fault.
type progress struct {
	w        io.Writer
	tty      bool
	name     string
	duration time.Duration
	cancel   context.CancelFunc
	done     chan struct{}

	mu    sync.Mutex
	phase string
	fault string
	wl    *workload
	start time.Time
	last  int64
	lastT time.Time
}

func newProgress(w io.Writer, tty bool, name string, d time.Duration) *progress {
	p := &progress{w: w, tty: tty, name: name, duration: d, done: make(chan struct{})}
	if w == nil {
		close(p.done)
		return p
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	every := 5 * time.Second
	if tty {
		every = time.Second
	}
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.print(false)
			}
		}
	}()
	return p
}

func (p *progress) attach(w *workload, start time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wl, p.start, p.lastT = w, start, start
}

func (p *progress) setPhase(s string) {
	p.mu.Lock()
	p.phase = s
	p.mu.Unlock()
}

func (p *progress) setFault(s string) {
	p.mu.Lock()
	p.fault = s
	p.mu.Unlock()
	if s != "" && !p.tty {
		p.print(false)
	}
}

// stop ends the progress line.
func (p *progress) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	p.print(true)
	p.cancel = nil
}

func (p *progress) print(final bool) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	line := fmt.Sprintf("[%s] %s", p.name, p.phase)
	if p.wl != nil {
		now := time.Now()
		ops, errs := p.wl.ops.Load(), p.wl.errs.Load()
		rate := float64(ops-p.last) / max(now.Sub(p.lastT).Seconds(), 0.001)
		p.last, p.lastT = ops, now
		line = fmt.Sprintf("[%s] %4.0fs/%v  calls %d (%.0f/s)  errors %d  %s", p.name,
			now.Sub(p.start).Seconds(), p.duration, ops, rate, errs, p.phase)
	}
	if p.fault != "" {
		line += "  fault: " + p.fault
	}
	switch {
	case p.tty && final:
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	case p.tty:
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}
