// Package depcheck has no code of its own: its tests check that the
// library packages (the root package idem, engine, idemhttp, idemgrpc, idemprom, store,
// memcoord, fingerprint, coordclient, fencing, sidecar) change nothing in
// the programs that import them and pull only the dependencies they need
// (the root package and memcoord: the standard library alone).
//
//   - TestLibraryDependencies lists each library package's dependencies
//     with `go list -deps` and fails on an exporter, a server, test
//     machinery, or a package whose import registers handlers on
//     http.DefaultServeMux, naming the chain of imports that pulls it.
//   - TestNothingOnDefaultServeMux links the library packages that pull
//     no such package into one program (its test binary) and checks that
//     http.DefaultServeMux serves nothing.
//
// The dependency counts before and after the library was made to import
// nothing it does not need are in docs/dependencies.md.
package depcheck
