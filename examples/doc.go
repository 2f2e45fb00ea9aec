// Package examples holds runnable walkthroughs (see README.md): the sidecar
// in front of a plain upstream (sidecar/, with the upstream program in
// sidecar/upstream) and the coordination API with curl (coordination/).
// Their test runs each against real idemd processes on PostgreSQL.
package examples
