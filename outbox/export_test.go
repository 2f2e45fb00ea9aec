package outbox

// SavepointPerDelivery makes c run every batch with a savepoint per
// delivery from the start: the cost the first attempt without savepoints
// avoids, for BenchmarkConsumeBatch.
func SavepointPerDelivery(c *Consumers) *Consumers {
	c.isolateAll = true
	return c
}
