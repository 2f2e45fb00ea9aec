package routing

import "strings"

// Key layout in etcd.
const (
	// PlacementPrefix + tenant holds a tenant's own placement.
	PlacementPrefix = "/idem/placement/tenants/"
	// RegionPlacementPrefix + region holds the region's indirection: which
	// region serves the tenants homed in it (see RegionMove).
	RegionPlacementPrefix = "/idem/placement/regions/"
	// DefaultRegionsKey holds the region list a tenant without a placement is
	// homed in by DefaultHome, identically on every node.
	DefaultRegionsKey = "/idem/placement/default-regions"
	// RegionsPrefix + region + "/nodes/" + node id holds a live node.
	RegionsPrefix = "/idem/regions/"
	// FailoverPrefix + tenant records the tenant's last planned move.
	FailoverPrefix = "/idem/failovers/"
	// HandoverPrefix + region records that the old server's records of the
	// tenants a RegionMove moved were handed over ({"epoch": the move's}).
	HandoverPrefix = "/idem/handovers/regions/"
	// LocksPrefix + tenant/operation/key/ holds recovery fencing locks.
	LocksPrefix = "/idem/locks/"
)

// NodeKey returns the liveness key of a node.
func NodeKey(region, nodeID string) string { return RegionsPrefix + region + "/nodes/" + nodeID }

// RegionNodesPrefix returns the prefix of a region's node keys.
func RegionNodesPrefix(region string) string { return RegionsPrefix + region + "/nodes/" }

// parseNodeKey splits /idem/regions/<region>/nodes/<id>.
func parseNodeKey(key string) (region, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, RegionsPrefix)
	if !ok {
		return "", "", false
	}
	region, id, ok = strings.Cut(rest, "/nodes/")
	return region, id, ok && region != "" && id != ""
}
