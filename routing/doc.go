// Package routing decides which region is home for a tenant and keeps every
// node's view of that decision current.
//
// The control plane is etcd. A tenant is placed in a region either by a key
// of its own, /idem/placement/tenants/<tenant> ({"region":"eu-west"}), or,
// without one, by the default rule: [DefaultHome], a rendezvous hash of the
// tenant over the region list stored once at /idem/placement/default-regions
// ({"regions":[...]}). Every node computes the same default home without a
// write, so a new tenant's first request needs no consensus round.
//
// A region failover is one key, /idem/placement/regions/<from>
// ({"servedBy":"us-east","from":...,"at":...}): the tenants placed in
// <from> before that key's ModRevision are served by servedBy. A tenant's
// effective home is its placement followed through such keys (each only if
// written after the epoch reached so far), and its effective epoch is the
// highest ModRevision on that path, so every change of effective home has a
// higher epoch than the last, for one tenant or ten million. [MoveRegion]
// writes the key only once <from> (and the region that served its tenants
// until then) has no live node left in etcd; [FailBack] points it back at
// <from> with a new epoch; a planned move of one tenant ([MoveTenant]) writes
// the tenant's own key, which overrides every older region key. The region
// key is the failover record of every tenant it moved; the handover mark is
// one key too (/idem/handovers/regions/<from>).
//
// Each node registers /idem/regions/<region>/nodes/<node-id> ({"url"})
// under its own lease: a region is alive while any of its nodes' keys exist.
//
// [Map] is a node's watched local copy of all of it, loaded in pages at one
// revision. Forwarding nodes may use a stale map; the home node checks its
// own lease (see package fencing) and that its map has caught up with its
// latest registration before it claims anything.
package routing
