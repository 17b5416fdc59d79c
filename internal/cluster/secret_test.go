package cluster

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestJoinSecretCreateAndReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "join-secret")
	if _, err := ReadJoinSecret(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadJoinSecret before create: err = %v, want fs.ErrNotExist", err)
	}
	s1, err := LoadOrCreateJoinSecret(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(s1) != 32 {
		t.Fatalf("created secret is %d bytes, want 32", len(s1))
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("created file mode %o, want 600", perm)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := hex.EncodeToString(s1) + "\n"; string(raw) != want {
		t.Errorf("file holds %q, want %q", raw, want)
	}
	if m, _ := filepath.Glob(path + ".tmp*"); len(m) != 0 {
		t.Errorf("temporary files left behind: %v", m)
	}
	for name, load := range map[string]func(string) ([]byte, error){
		"LoadOrCreateJoinSecret": LoadOrCreateJoinSecret,
		"ReadJoinSecret":         ReadJoinSecret,
	} {
		s2, err := load(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(s1, s2) {
			t.Errorf("%s = %x, want %x", name, s2, s1)
		}
	}
	// A second directory gets a different secret.
	s3, err := LoadOrCreateJoinSecret(filepath.Join(t.TempDir(), "join-secret"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(s1, s3) {
		t.Error("two created secrets are equal")
	}
}

// Concurrent creators all end up with the secret in the file.
func TestJoinSecretConcurrentCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "join-secret")
	const n = 8
	got := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = LoadOrCreateJoinSecret(path) })
	}
	wg.Wait()
	want, err := ReadJoinSecret(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil || !bytes.Equal(got[i], want) {
			t.Errorf("creator %d: %x, %v; file holds %x", i, got[i], errs[i], want)
		}
	}
}

func TestJoinSecretFiles(t *testing.T) {
	key16 := strings.Repeat("ab", 16)
	key32 := strings.Repeat("0f", 32)
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
		want    string // hex of the secret, if no error
		wantErr string // substring of the error
	}{
		{"32 bytes with newline", key32 + "\n", 0o600, key32, ""},
		{"32 bytes without newline", key32, 0o600, key32, ""},
		{"16 bytes", key16 + "\n", 0o600, key16, ""},
		{"upper case hex", strings.ToUpper(key32) + "\n", 0o600, key32, ""},
		{"owner read only", key32 + "\n", 0o400, key32, ""},
		{"group readable", key32 + "\n", 0o640, "", "readable by others (mode 640); chmod 600 it"},
		{"world readable", key32 + "\n", 0o644, "", "readable by others (mode 644); chmod 600 it"},
		{"group writable", key32 + "\n", 0o620, "", "readable by others (mode 620); chmod 600 it"},
		{"other executable", key32 + "\n", 0o601, "", "readable by others (mode 601); chmod 600 it"},
		{"empty", "", 0o600, "", "secret is 0 bytes"},
		{"too short", strings.Repeat("ab", 15) + "\n", 0o600, "", "secret is 15 bytes, want at least 16"},
		{"not hex", strings.Repeat("zz", 32) + "\n", 0o600, "", "not a hex string"},
		{"odd length", key32 + "a\n", 0o600, "", "not a hex string"},
		{"two newlines", key32 + "\n\n", 0o600, "", "not a hex string"},
		{"leading space", " " + key32 + "\n", 0o600, "", "not a hex string"},
		{"CRLF", key32 + "\r\n", 0o600, "", "not a hex string"},
		{"too long", strings.Repeat("ab", 5000), 0o600, "", "too long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "join-secret")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil { // not subject to umask
				t.Fatal(err)
			}
			for name, load := range map[string]func(string) ([]byte, error){
				"LoadOrCreateJoinSecret": LoadOrCreateJoinSecret,
				"ReadJoinSecret":         ReadJoinSecret,
			} {
				got, err := load(path)
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), path) {
						t.Errorf("%s: err = %v, want one naming %s and containing %q", name, err, path, tc.wantErr)
					}
					if err != nil && len(tc.content) >= 8 && strings.Contains(err.Error(), strings.TrimSpace(tc.content)[:8]) {
						t.Errorf("%s: error shows the file's contents: %v", name, err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				if hex.EncodeToString(got) != tc.want {
					t.Errorf("%s = %x, want %s", name, got, tc.want)
				}
			}
			// A refused file is left alone, never replaced.
			if b, _ := os.ReadFile(path); string(b) != tc.content {
				t.Errorf("file changed to %q", b)
			}
		})
	}
}

func TestReadJoinSecretMissing(t *testing.T) {
	tests := []struct {
		name string
		path func(dir string) string
	}{
		{"missing file", func(dir string) string { return filepath.Join(dir, "join-secret") }},
		{"missing directory", func(dir string) string { return filepath.Join(dir, "nodir", "join-secret") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path(t.TempDir())
			_, err := ReadJoinSecret(path)
			if !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("err = %v, want fs.ErrNotExist", err)
			}
			for _, s := range []string{path, "shoal mds", "--dir"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("ReadJoinSecret created %s", path)
			}
		})
	}
}

func TestJoinSecretNotRegular(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "join-secret")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateJoinSecret(path); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: err = %v", err)
	}
}
