\set k random(1, 1000000000000000)
\set h random(1, 1000000000000000)
WITH pay AS (
		INSERT INTO payments_keyed (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at,
			operation_name, idempotency_key, request_hash, hash_version, record_status, checkpoint,
			owner, fencing_token, locked_until, home_region, expires_at, response_status, response_schema_version, raw_hash)
		VALUES ('bt', 'pay_' || :k, 'acc_1', 1050, 'EUR', 'inv-' || :k, 'api', 'PENDING', 'pk_' || :k, now(), now(),
			'create_payment', 'key-' || :k, 'v2:' || md5(:k::text), 2, 'COMPLETED', 'COMPLETED', '', 1,
			CASE WHEN 'COMPLETED' = 'IN_PROGRESS' THEN now() + 30000::INT8 * INTERVAL '1 millisecond' END,
			'bench', now() + 86400000::INT8 * INTERVAL '1 millisecond', 201, 'v1', 'r1:' || md5(:h::text))
		ON CONFLICT DO NOTHING
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT 'evt_' || :k, 'bt', payment_id, 'PaymentCreated', '{"a":1}', now() FROM pay
	RETURNING now();
