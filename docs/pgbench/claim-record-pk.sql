\set k random(1, 1000000000000000)
WITH claim AS (
		INSERT INTO rec_pk
			(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
			 owner, fencing_token, locked_until, home_region, created_at, updated_at, expires_at,
			 response_status, response_headers, response_body, response_schema_version, response_by_reference,
			 resource_type, resource_id, raw_hash)
		VALUES ('bt', 'create_payment', 'key-' || :k, 'v2:' || '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef' , 2, 'COMPLETED', 'COMPLETED', '', 1,
			CASE WHEN 'COMPLETED' = 'IN_PROGRESS' THEN now() + 30000::INT8 * INTERVAL '1 millisecond' END,
			'bench', now(), now(), now() + 86400000::INT8 * INTERVAL '1 millisecond',
			201, NULL, NULL, 'v1', true, 'payment', 'pay_' || :k, 'r1:' || '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef')
		ON CONFLICT DO NOTHING
		RETURNING 1 AS n
	)
, pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		SELECT 'bt', 'pay_' || :k, 'acc_1', 1050, 'EUR', 'inv-' || :k, 'api', 'PENDING', 'pk_' || :k, now(), now() FROM claim
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT 'evt_' || :k, 'bt', payment_id, 'PaymentCreated', '{"a":1}', now() FROM pay
	RETURNING now();
