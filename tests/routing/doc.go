// Package routing holds the tests and benchmarks of package routing that
// put etcd behind a WAN (toxiproxy latency on client or peer links) or run
// a three-member etcd cluster in process: they live in the tests module so
// that the library's module needs no requirement on toxiproxy or the etcd
// server.
package routing
