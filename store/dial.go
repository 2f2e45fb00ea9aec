package store

import (
	"context"
	"net"
	"time"
)

// Connections to the store that a network partition leaves silent (no FIN,
// no RST: packets go nowhere) must fail within seconds, not when TCP gives
// up retransmitting (about 15 minutes on Linux), or every request that
// picks one from the pool hangs until its deadline. Idle connections are
// probed (keepalive); a connection whose sent data stays unacknowledged
// for userTimeout is aborted by the kernel (TCP_USER_TIMEOUT, on Linux).
const (
	keepAliveIdle     = 5 * time.Second
	keepAliveInterval = 2 * time.Second
	keepAliveCount    = 3
	userTimeout       = 15 * time.Second
)

// dialer returns the pool's dialer.
func dialer() *net.Dialer {
	return &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount},
		Control:         setUserTimeout,
	}
}

// dial is pgx's DialFunc.
func dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialer().DialContext(ctx, network, addr)
}
