package engine_test

import (
	"fmt"
	"testing"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// exampleTB lets an Example use the test helpers that give a store on a
// throwaway database of the server TestMain started. Only the methods those
// helpers call are implemented; failures panic, which fails the Example.
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

// exampleStore returns a migrated store and the function that drops it.
func exampleStore() (*store.Store, func()) {
	tb := &exampleTB{}
	st, _ := storetest.New(tb)
	return st, tb.close
}
