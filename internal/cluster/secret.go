package cluster

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Join secret file: the secret data servers present to join a cluster. It
// holds the secret hex-encoded, optionally followed by a newline, and must
// be readable by its owner only.
const (
	joinSecretLen    = 32 // bytes made by LoadOrCreateJoinSecret
	joinSecretMinLen = 16 // shortest secret accepted from a file
	joinSecretMaxLen = 1024
)

// LoadOrCreateJoinSecret returns the join secret stored in path, creating
// the file with 32 random bytes (mode 0600, written atomically) if it does
// not exist. It refuses a file that group or others may access, one that
// is not hex, and a secret shorter than 16 bytes.
func LoadOrCreateJoinSecret(path string) ([]byte, error) {
	b, err := readJoinSecret(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return b, err
	}
	secret := make([]byte, joinSecretLen)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("cluster: join secret: %w", err)
	}
	created, err := createJoinSecret(path, secret)
	if err != nil {
		return nil, fmt.Errorf("cluster: join secret file %s: %w", path, err)
	}
	if !created { // another process created it first: use theirs
		return ReadJoinSecret(path)
	}
	return secret, nil
}

// ReadJoinSecret returns the join secret stored in path, with the same
// checks as LoadOrCreateJoinSecret, but never creates the file: a data
// server reads the secret its metadata server made. A missing file is an
// error wrapping fs.ErrNotExist.
func ReadJoinSecret(path string) ([]byte, error) {
	b, err := readJoinSecret(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("cluster: join secret file %s: %w (it is created by `shoal mds` in its --dir on first start)", path, fs.ErrNotExist)
	}
	return b, err
}

// readJoinSecret reads and checks a join secret file. A missing file is
// returned as an error wrapping fs.ErrNotExist.
func readJoinSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: join secret file: %w", err) // err names path
	}
	defer f.Close()
	fi, err := f.Stat() // of the file opened, not of whatever path names now
	if err != nil {
		return nil, fmt.Errorf("cluster: join secret file %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("cluster: join secret file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("cluster: join secret file %s is readable by others (mode %o); chmod 600 it", path, perm)
	}
	raw, err := io.ReadAll(io.LimitReader(f, 2*joinSecretMaxLen+2))
	if err != nil {
		return nil, fmt.Errorf("cluster: join secret file %s: %w", path, err)
	}
	// The contents are never put in an error: they are the secret.
	text := raw
	if n := len(text); n > 0 && text[n-1] == '\n' {
		text = text[:n-1]
	}
	if len(text) > 2*joinSecretMaxLen {
		return nil, fmt.Errorf("cluster: join secret file %s is too long (want at most %d hex digits)", path, 2*joinSecretMaxLen)
	}
	secret := make([]byte, hex.DecodedLen(len(text)))
	if _, err := hex.Decode(secret, text); err != nil {
		return nil, fmt.Errorf("cluster: join secret file %s: not a hex string", path)
	}
	if len(secret) < joinSecretMinLen {
		return nil, fmt.Errorf("cluster: join secret file %s: secret is %d bytes, want at least %d (%d hex digits)",
			path, len(secret), joinSecretMinLen, 2*joinSecretMinLen)
	}
	return secret, nil
}

// createJoinSecret writes secret to path atomically: a temporary file in
// the same directory, synced, then linked into place and the directory
// synced. It reports false, with no error, if path already exists (a
// concurrent creator won), so a secret once handed out is never replaced.
func createJoinSecret(path string, secret []byte) (created bool, err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600; chmod anyway so the mode does not
	// depend on that.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return false, err
	}
	if _, err := tmp.WriteString(hex.EncodeToString(secret) + "\n"); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	// A hard link fails if path exists, where rename would replace it.
	// Where links are not supported, fall back to rename.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		if err := os.Rename(tmp.Name(), path); err != nil {
			return false, err
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return false, err
	}
	return true, nil
}

// SaveJoinSecret makes path hold secret: it creates the file as
// LoadOrCreateJoinSecret would, and accepts one that already holds the
// same secret. A file holding another secret is an error: it would hand
// data servers a secret the cluster does not accept. Metadata servers
// that share their metadata (several on one etcd cluster) keep the
// cluster's secret there and write it out with this.
func SaveJoinSecret(path string, secret []byte) error {
	old, err := readJoinSecret(path)
	switch {
	case err == nil && bytes.Equal(old, secret):
		return nil
	case err == nil:
		return fmt.Errorf("cluster: join secret file %s holds another secret than the cluster's (kept in its metadata); remove the file to have it written again", path)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	created, err := createJoinSecret(path, secret)
	if err != nil {
		return fmt.Errorf("cluster: join secret file %s: %w", path, err)
	}
	if !created {
		return SaveJoinSecret(path, secret)
	}
	return nil
}
