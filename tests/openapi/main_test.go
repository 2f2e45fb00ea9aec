package openapi_test

import (
	"os"
	"testing"

	"github.com/idemcoord/idem/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }
