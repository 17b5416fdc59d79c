package spec

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNFS3Numbers checks nfs3.x against the numbers RFC 1813 publishes:
// the programs and their procedure numbers, the status codes, the file
// types, the stability and creation modes, and the sizes.
func TestNFS3Numbers(t *testing.T) {
	s := loadFiles(t, "nfs3.x")
	for name, want := range map[string]int64{
		"NFS3_FHSIZE": 64, "NFS3_COOKIEVERFSIZE": 8, "NFS3_CREATEVERFSIZE": 8, "NFS3_WRITEVERFSIZE": 8,
		"MNTPATHLEN3": 1024, "MNTNAMLEN3": 255, "FHSIZE3": 64,
		"NFS3_OK": 0, "NFS3ERR_PERM": 1, "NFS3ERR_NOENT": 2, "NFS3ERR_IO": 5, "NFS3ERR_NXIO": 6,
		"NFS3ERR_ACCES": 13, "NFS3ERR_EXIST": 17, "NFS3ERR_XDEV": 18, "NFS3ERR_NODEV": 19,
		"NFS3ERR_NOTDIR": 20, "NFS3ERR_ISDIR": 21, "NFS3ERR_INVAL": 22, "NFS3ERR_FBIG": 27,
		"NFS3ERR_NOSPC": 28, "NFS3ERR_ROFS": 30, "NFS3ERR_MLINK": 31, "NFS3ERR_NAMETOOLONG": 63,
		"NFS3ERR_NOTEMPTY": 66, "NFS3ERR_DQUOT": 69, "NFS3ERR_STALE": 70, "NFS3ERR_REMOTE": 71,
		"NFS3ERR_BADHANDLE": 10001, "NFS3ERR_NOT_SYNC": 10002, "NFS3ERR_BAD_COOKIE": 10003,
		"NFS3ERR_NOTSUPP": 10004, "NFS3ERR_TOOSMALL": 10005, "NFS3ERR_SERVERFAULT": 10006,
		"NFS3ERR_BADTYPE": 10007, "NFS3ERR_JUKEBOX": 10008,
		"NF3REG": 1, "NF3DIR": 2, "NF3BLK": 3, "NF3CHR": 4, "NF3LNK": 5, "NF3SOCK": 6, "NF3FIFO": 7,
		"DONT_CHANGE": 0, "SET_TO_SERVER_TIME": 1, "SET_TO_CLIENT_TIME": 2,
		"UNSTABLE": 0, "DATA_SYNC": 1, "FILE_SYNC": 2,
		"UNCHECKED": 0, "GUARDED": 1, "EXCLUSIVE": 2,
		"MNT3_OK": 0, "MNT3ERR_PERM": 1, "MNT3ERR_NOENT": 2, "MNT3ERR_IO": 5, "MNT3ERR_ACCES": 13,
		"MNT3ERR_NOTDIR": 20, "MNT3ERR_INVAL": 22, "MNT3ERR_NAMETOOLONG": 63,
		"MNT3ERR_NOTSUPP": 10004, "MNT3ERR_SERVERFAULT": 10006,
	} {
		if got := s.value(t, name); got != want {
			t.Errorf("%s = %d, want %d (RFC 1813)", name, got, want)
		}
	}

	type proc struct{ name, num string }
	want := map[string]struct {
		prog, vers string
		procs      []proc
	}{
		"NFS_PROGRAM": {"100003", "3", []proc{{"NFSPROC3_NULL", "0"}, {"NFSPROC3_GETATTR", "1"}, {"NFSPROC3_SETATTR", "2"},
			{"NFSPROC3_LOOKUP", "3"}, {"NFSPROC3_READ", "6"}, {"NFSPROC3_WRITE", "7"}, {"NFSPROC3_CREATE", "8"},
			{"NFSPROC3_REMOVE", "12"}, {"NFSPROC3_COMMIT", "21"}}},
		"MOUNT_PROGRAM": {"100005", "3", []proc{{"MOUNTPROC3_NULL", "0"}, {"MOUNTPROC3_MNT", "1"}, {"MOUNTPROC3_UMNT", "3"}}},
	}
	found := 0
	for _, p := range strings.Split(s.text, "program ")[1:] {
		m := programRE.FindStringSubmatch("program " + p)
		if m == nil {
			t.Fatalf("cannot parse program near %.60q", p)
		}
		w, ok := want[m[1]]
		if !ok {
			t.Errorf("unexpected program %s", m[1])
			continue
		}
		found++
		v := versionRE.FindStringSubmatch(m[2])
		if m[3] != w.prog || v == nil || v[3] != w.vers {
			t.Errorf("%s = %s version %v, want %s version %s", m[1], m[3], v, w.prog, w.vers)
			continue
		}
		var got []proc
		for _, pm := range procRE.FindAllStringSubmatch(v[2], -1) {
			got = append(got, proc{pm[1], pm[2]})
		}
		if len(got) != len(w.procs) {
			t.Errorf("%s procedures = %v, want %v", m[1], got, w.procs)
			continue
		}
		for i := range got {
			if got[i] != w.procs[i] {
				t.Errorf("%s procedure %d = %v, want %v", m[1], i, got[i], w.procs[i])
			}
		}
	}
	if found != len(want) {
		t.Errorf("found %d programs, want %d", found, len(want))
	}
}

// TestNFS3Rpcgen runs the reference XDR compiler over nfs3.x (skipped
// where rpcgen is not installed).
func TestNFS3Rpcgen(t *testing.T) {
	rpcgen, err := exec.LookPath("rpcgen")
	if err != nil {
		t.Skip("rpcgen not installed")
	}
	if _, err := os.Stat("nfs3.x"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(rpcgen, "-h", "nfs3.x").CombinedOutput(); err != nil {
		t.Fatalf("rpcgen -h nfs3.x: %v\n%s", err, out)
	}
}
