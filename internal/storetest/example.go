package storetest

import (
	"fmt"
	"testing"

	"github.com/idemcoord/idem/store"
)

// ForExample returns a migrated store on a throwaway database of the
// server TestMain started, and the function that drops it, for Example
// functions, which have no testing.TB. A failure panics, which fails the
// Example.
func ForExample() (*store.Store, func()) {
	tb := &exampleTB{}
	st, _ := New(tb)
	return st, tb.close
}

// exampleTB implements the methods New and the helpers it calls use;
// failures panic.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()                        {}
func (e *exampleTB) Name() string                   { return "Example" }
func (e *exampleTB) Fatal(args ...any)              { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (e *exampleTB) Errorf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (e *exampleTB) Cleanup(f func())               { e.cleanups = append(e.cleanups, f) }

// close runs the cleanups, last first.
func (e *exampleTB) close() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
