package region

import "context"

// startOutbox starts the outbox publisher, the consumers and the email sender.
func (s *Server) startOutbox(ctx context.Context, cfg WorkerConfig) {}
