//go:build failpoints

package store

import (
	"context"
	"fmt"

	"github.com/idemcoord/idem"
)

// UnfencedToken marks a lease whose writes skip the fencing check. It exists
// only for the deliberately broken mode --break no-fencing, which the chaos
// harness must catch; nothing else may use it, and release builds (without
// -tags failpoints) do not have it.
const UnfencedToken int64 = -1

// unfencedWhere is the condition of an UnfencedToken lease's writes: the
// record's key alone.
func unfencedWhere(lease idem.Lease) (string, bool) {
	if lease.Token != UnfencedToken {
		return "", false
	}
	return `tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3 AND $4::INT8 = $4::INT8`, true
}

// UpsertCompleted writes a COMPLETED record whatever is there (last writer
// wins). It exists only for the deliberately broken mode --break
// find-then-insert (built with -tags failpoints); the product never
// overwrites a record.
func UpsertCompleted(ctx context.Context, q Querier, req idem.BeginRequest, c idem.Completion) error {
	r, err := responseColumns(&c.Response)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, `INSERT INTO idempotency_records
		(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint, owner,
		 home_region, created_at, updated_at, expires_at, response_status, response_headers, response_body,
		 response_schema_version, response_by_reference, resource_type, resource_id)
		VALUES ($1, $2, $3, $4, $5, 'COMPLETED', 'COMPLETED', $6, $7, now(), now(), now() + $8::INT8 * INTERVAL '1 millisecond',
		 $9, $10, $11, $12, $15, $13, $14)
		ON CONFLICT (tenant_id, operation_name, idempotency_key) DO UPDATE SET
		 response_status = EXCLUDED.response_status, response_headers = EXCLUDED.response_headers,
		 response_body = EXCLUDED.response_body, response_by_reference = EXCLUDED.response_by_reference, resource_id = EXCLUDED.resource_id, updated_at = now()`,
		req.Tenant, req.Operation, req.Key, req.RequestHashes[0], req.HashVersion, req.Owner, req.HomeRegion,
		req.Window.Milliseconds(), r.status, r.headers, r.body, r.schema,
		nullable(c.ResourceType), nullable(c.ResourceID), r.byReference)
	if err != nil {
		return fmt.Errorf("store: upsert record: %w", err)
	}
	return nil
}
