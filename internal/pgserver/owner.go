package pgserver

import "syscall"

// Credential returns the credential PostgreSQL's processes run with: nil
// when they can run as the current user, the "postgres" OS user's when the
// caller is root (PostgreSQL refuses to run as root). Packages that start
// PostgreSQL through another program (an HA manager such as Patroni) use it
// so that their servers run as pgserver's do.
func Credential() (*syscall.Credential, error) { return serverCredential() }

// MkdirAllOwned is os.MkdirAll(dir, 0o700), giving the directories it
// creates (only those) to cred (nil: the current user).
func MkdirAllOwned(dir string, cred *syscall.Credential) error { return mkdirAllOwned(dir, cred) }

// Chown gives path to cred; nil cred does nothing.
func Chown(path string, cred *syscall.Credential) error { return chown(path, cred) }
