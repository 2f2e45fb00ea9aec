// Package ambiguous holds the tests of ambiguous commits: a proxy
// (package commitcut, on toxiproxy) loses the answer to a commit the store
// made, and the engine and the payments service must answer what was
// stored, never run the effect twice. They live in the tests module so
// that the library's module needs no requirement on toxiproxy.
package ambiguous
