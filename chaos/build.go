package chaos

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// FailpointsTag is the build tag that compiles fault injection into idemd
// (--break, --duplicate-delivery, IDEM_FAILPOINTS, IDEM_CLOCK_SKEW). A
// release idemd has none of it, so chaos runs need their own build.
const FailpointsTag = "failpoints"

// BuildCommand builds, from the module root, every binary a chaos run needs
// into ./bin, idemd with fault injection compiled in.
const BuildCommand = "go build -tags " + FailpointsTag + " -o bin/ ./cmd/idemd ./cmd/idemctl && go build -o bin/etcd go.etcd.io/etcd/server/v3"

// ErrNoFailpoints reports an idemd built without -tags failpoints: it cannot
// take the faults of a chaos run.
var ErrNoFailpoints = errors.New("chaos: this idemd was built without -tags " + FailpointsTag)

// RequireFailpoints returns an error wrapping ErrNoFailpoints unless the Go
// binary idemd was built with -tags failpoints (read from its build
// information, as `go version -m` does).
func RequireFailpoints(idemd string) error {
	if _, err := os.Stat(idemd); err != nil {
		return fmt.Errorf("chaos: idemd binary: %w", err)
	}
	info, err := buildinfo.ReadFile(idemd)
	if err != nil {
		return fmt.Errorf("%w: %s has no Go build information (%v); build with: %s", ErrNoFailpoints, idemd, err, BuildCommand)
	}
	for _, s := range info.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), FailpointsTag) {
			return nil
		}
	}
	return fmt.Errorf("%w (%s); build with: %s", ErrNoFailpoints, idemd, BuildCommand)
}
