//go:build !linux

package store

import "syscall"

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist.
func setUserTimeout(string, string, syscall.RawConn) error { return nil }
