\set k random(1, 1000000000000000)
WITH ins AS (INSERT INTO idempotency_records
		(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
		 owner, fencing_token, locked_until, home_region, created_at, updated_at, expires_at, claim_id, raw_hash)
		VALUES ('bt', 'sidecar_post', 'key-' || :k, 'v2:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', 2, 'IN_PROGRESS', 'RECEIVED', 'node-1', 1,
		 now() + 30000::INT8 * INTERVAL '1 millisecond', 'bench', now(), now(), now() + 86400000::INT8 * INTERVAL '1 millisecond', 'c-' || :k, 'r1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef')
		ON CONFLICT DO NOTHING
		RETURNING tenant_id, operation_name, idempotency_key, request_hash, hash_version,
	status, checkpoint, owner, fencing_token, locked_until, attempts, generation,
	response_status, response_headers, response_body, response_schema_version,
	resource_type, resource_id, error_code, home_region, created_at, updated_at, expires_at,
	response_by_reference, raw_hash)
	SELECT tenant_id, operation_name, idempotency_key, request_hash, hash_version,
	status, checkpoint, owner, fencing_token, locked_until, attempts, generation,
	response_status, response_headers, response_body, response_schema_version,
	resource_type, resource_id, error_code, home_region, created_at, updated_at, expires_at,
	response_by_reference, raw_hash, now(), true FROM ins
	UNION ALL
	SELECT tenant_id, operation_name, idempotency_key, request_hash, hash_version,
	status, checkpoint, owner, fencing_token, locked_until, attempts, generation,
	response_status, response_headers, response_body, response_schema_version,
	resource_type, resource_id, error_code, home_region, created_at, updated_at, expires_at,
	response_by_reference, raw_hash, now(), false FROM idempotency_records
		WHERE tenant_id = 'bt' AND operation_name = 'sidecar_post' AND idempotency_key = 'key-' || :k AND NOT EXISTS (SELECT 1 FROM ins);
