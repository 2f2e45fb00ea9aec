// Package routing decides which region is home for a tenant and keeps every
// node's view of that decision current.
//
// The control plane is etcd. A tenant's placement lives at
// /idem/placement/tenants/<tenant> ({"region":"eu-west"}); its epoch is the
// key's ModRevision, so every change of home has a higher epoch than the
// last. Each node registers /idem/regions/<region>/nodes/<node-id> ({"url"})
// under its own lease: a region is alive while any of its nodes' keys exist.
// A failover (/idem/failovers/<tenant>) is written together with the new
// placement, and only once the old region has no live node left in etcd.
//
// [Map] is a node's watched local copy of all three. Forwarding nodes may use
// a stale map; the home node checks its own lease (see package fencing) and
// that its map has caught up before it claims anything.
package routing
