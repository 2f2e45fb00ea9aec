// Package fakeclock is a clock for tests of code that waits: its Sleep
// says that a caller waits and returns only when the test lets it, so a test
// observes "the request is waiting" without a wall-clock sleep.
package fakeclock

import (
	"context"
	"sync"
	"time"
)

// Step is a clock whose time moves only by the durations its sleepers
// asked for. Sleep first signals Sleeping (without blocking if nobody
// listens), then waits until Tick is closed (or receives) or ctx is done.
// Its Now and Sleep satisfy the engine's Clock.
type Step struct {
	// Sleeping receives a value when a Sleep starts (buffered, 1).
	Sleeping chan struct{}
	// Tick releases sleepers: close it to release every present and future
	// one.
	Tick chan struct{}

	mu  sync.Mutex
	now time.Time
}

// NewStep returns a Step clock starting at start.
func NewStep(start time.Time) *Step {
	return &Step{Sleeping: make(chan struct{}, 1), Tick: make(chan struct{}), now: start}
}

// Now returns the clock's time.
func (c *Step) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep signals Sleeping, waits for Tick (or ctx), then moves the clock on
// by d.
func (c *Step) Sleep(ctx context.Context, d time.Duration) error {
	select {
	case c.Sleeping <- struct{}{}:
	default:
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.Tick:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return nil
}
