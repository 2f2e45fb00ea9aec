package telemetry

import "runtime/debug"

// Version is the program's version. Set it at build time with
// -ldflags "-X github.com/idemcoord/idem/internal/telemetry.Version=v1.2.3";
// empty, it is the main module's version from the build information
// ("(devel)" for a build from a work tree).
var Version = ""

// BuildVersion returns Version, or the main module's version recorded in
// the binary, or "unknown".
func BuildVersion() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "unknown"
}
