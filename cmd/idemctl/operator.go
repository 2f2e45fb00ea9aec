//go:build operator

package main

// toolingCommands is empty in the operator build (go build -tags operator),
// the production image's idemctl: the operator's commands only, without the
// chaos harness, the local cluster launcher and the benchmarks, and without
// their dependencies.
func toolingCommands() map[string]command { return nil }
