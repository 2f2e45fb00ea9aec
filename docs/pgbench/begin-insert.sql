\set k random(1, 1000000000000000)
INSERT INTO idempotency_records
		(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
		 owner, fencing_token, locked_until, home_region, created_at, updated_at, expires_at, claim_id, raw_hash)
		VALUES ('bt', 'sidecar_post', 'key-' || :k, 'v2:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', 2, 'IN_PROGRESS', 'RECEIVED', 'node-1', 1,
		 now() + 30000::INT8 * INTERVAL '1 millisecond', 'bench', now(), now(), now() + 86400000::INT8 * INTERVAL '1 millisecond', 'c-' || :k, 'r1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef')
		ON CONFLICT DO NOTHING
		RETURNING created_at;
