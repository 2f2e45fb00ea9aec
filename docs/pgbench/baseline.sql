\set k random(1, 1000000000000000)
\set h random(1, 1000000000000000)
WITH pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		VALUES ('bt', 'pay_' || :k, 'acc_1', 1050, 'EUR', 'inv-' || :k, 'api', 'PENDING', 'pk_' || :k, now(), now())
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT 'evt_' || :k, 'bt', payment_id, 'PaymentCreated', '{"a":1}', now() FROM pay
	RETURNING now();
