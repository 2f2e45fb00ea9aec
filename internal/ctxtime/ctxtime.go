// Package ctxtime waits for a duration or a context, whichever ends first:
// the sleep that retry loops and clocks of the module use.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx is done, and then returns ctx.Err(). A d
// of zero or less returns at once (nil unless ctx is already done).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
