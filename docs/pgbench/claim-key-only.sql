\set k random(1, 1000000000000000)
WITH claim AS (
	INSERT INTO rec_keyonly (tenant_id, operation_name, idempotency_key) VALUES ('bt', 'create_payment', 'key-' || :k)
	ON CONFLICT DO NOTHING RETURNING 1 AS n
), pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		SELECT 'bt', 'pay_' || :k, 'acc_1', 1050, 'EUR', 'inv-' || :k, 'api', 'PENDING', 'pk_' || :k, now(), now() FROM claim
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT 'evt_' || :k, 'bt', payment_id, 'PaymentCreated', '{"a":1}', now() FROM pay
	RETURNING now();
