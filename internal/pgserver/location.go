package pgserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// FallbackRoot is where DirFor puts a server's directory when the OS user
// that runs the server cannot reach the one asked for. It is /var/tmp
// rather than /tmp so that the data survives a reboot, as a state
// directory's does.
const FallbackRoot = "/var/tmp"

// DirFor returns the directory to give Start as Options.Dir for dir. It is
// dir itself when the server's OS user can reach it: always when the
// caller is not root, and when running as root if the "postgres" user may
// search every existing parent of dir. Otherwise (dir is under a home
// directory of mode 0700, say) it is FallbackRoot/idem-pgserver-<hash>,
// where <hash> is derived from dir's absolute path, so every run for the
// same dir gets the same directory and reuses its cluster. Such a
// directory must not exist already unless it is a real directory (not a
// symbolic link) owned by the server's user, so that another local user
// cannot plant one.
func DirFor(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("pgserver: %w", err)
	}
	cred, err := serverCredential()
	if err != nil || cred == nil {
		return abs, err
	}
	existing := abs
	for {
		if _, err := os.Stat(existing); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("pgserver: %w", err)
		}
		existing = filepath.Dir(existing)
	}
	if checkReachable(existing, cred) == nil {
		return abs, nil
	}
	sum := sha256.Sum256([]byte(abs))
	fallback := filepath.Join(FallbackRoot, "idem-pgserver-"+hex.EncodeToString(sum[:])[:16])
	fi, err := os.Lstat(fallback)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fallback, nil
	case err != nil:
		return "", fmt.Errorf("pgserver: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || st.Uid != cred.Uid || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("pgserver: %s exists but is not a directory owned by OS user %q and writable only by it; remove it, or use a state directory that user can reach", fallback, osUser)
	}
	return fallback, nil
}
