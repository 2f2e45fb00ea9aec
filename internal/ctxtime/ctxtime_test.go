package ctxtime_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemcoord/idem/internal/ctxtime"
)

func TestSleep(t *testing.T) {
	if err := ctxtime.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("a finished sleep: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ctxtime.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled context: %v, want context.Canceled", err)
	}
	if err := ctxtime.Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("no wait on a cancelled context: %v, want context.Canceled", err)
	}
	if err := ctxtime.Sleep(context.Background(), -time.Second); err != nil {
		t.Errorf("a negative wait: %v", err)
	}
}
