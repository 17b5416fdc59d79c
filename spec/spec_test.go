// The checks below read the .x text on its own terms, without importing
// the generated package; see doc.go for why.

package spec

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// specFiles are the inputs of the generator, in generation order.
var specFiles = []string{"nfs4.x", "flexfiles.x"}

var (
	commentRE = regexp.MustCompile(`(?s)/\*.*?\*/`)
	constRE   = regexp.MustCompile(`\bconst\s+([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^;]+);`)
	enumRE    = regexp.MustCompile(`(?s)\benum\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{(.*?)\}`)
	unionRE   = regexp.MustCompile(`(?s)\bunion\s+([A-Za-z_][A-Za-z0-9_]*)\s+switch\s*\(([^)]*)\)\s*\{(.*?)\n\};`)
	structRE  = regexp.MustCompile(`(?s)\bstruct\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{(.*?)\};`)
	caseRE    = regexp.MustCompile(`(?s)case\s+([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(void|[A-Za-z_][A-Za-z0-9_]*\s+([A-Za-z_][A-Za-z0-9_]*))\s*;`)
	fieldRE   = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:<[^>]*>|\[[^\]]*\])?\s*;`)
	programRE = regexp.MustCompile(`(?s)\bprogram\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{(.*)\}\s*=\s*([0-9xXa-fA-F]+)\s*;`)
	versionRE = regexp.MustCompile(`(?s)\bversion\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{(.*?)\}\s*=\s*([0-9]+)\s*;`)
	procRE    = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*\(\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*=\s*([0-9]+)\s*;`)
)

// spec is the parsed view of the .x files that the checks need.
type spec struct {
	text    string            // all files, comments removed
	raw     map[string]string // constant or enum value name -> right-hand side
	enums   map[string][]string
	unions  map[string]string // union name -> body
	structs map[string]string // struct name -> body
}

func load(t *testing.T) *spec {
	t.Helper()
	return loadFiles(t, specFiles...)
}

// loadFiles parses the given .x files as one text.
func loadFiles(t *testing.T, files ...string) *spec {
	t.Helper()
	var all strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		all.Write(b)
		all.WriteString("\n")
	}
	s := &spec{
		text:    commentRE.ReplaceAllString(all.String(), " "),
		raw:     map[string]string{},
		enums:   map[string][]string{},
		unions:  map[string]string{},
		structs: map[string]string{},
	}
	define := func(name, val string) {
		if prev, dup := s.raw[name]; dup {
			t.Errorf("%s defined twice (%q and %q)", name, prev, val)
		}
		s.raw[name] = strings.TrimSpace(val)
	}
	for _, m := range constRE.FindAllStringSubmatch(s.text, -1) {
		define(m[1], m[2])
	}
	for _, m := range enumRE.FindAllStringSubmatch(s.text, -1) {
		for _, item := range strings.Split(m[2], ",") {
			name, val, ok := strings.Cut(item, "=")
			if !ok {
				if strings.TrimSpace(item) != "" {
					t.Errorf("enum %s: item %q has no value", m[1], item)
				}
				continue
			}
			name = strings.TrimSpace(name)
			define(name, val)
			s.enums[m[1]] = append(s.enums[m[1]], name)
		}
	}
	for _, m := range unionRE.FindAllStringSubmatch(s.text, -1) {
		s.unions[m[1]] = m[3]
	}
	for _, m := range structRE.FindAllStringSubmatch(s.text, -1) {
		s.structs[m[1]] = m[2]
	}
	return s
}

// value resolves name to a number, following symbolic definitions such as
// LAYOUTRETURN4_FILE = LAYOUT4_RET_REC_FILE. The depth bound stops cycles.
func (s *spec) value(t *testing.T, name string) int64 {
	t.Helper()
	cur := name
	for range 8 {
		v, ok := s.raw[cur]
		if !ok {
			t.Fatalf("%s is not defined", cur)
		}
		if n, err := strconv.ParseInt(v, 0, 64); err == nil {
			return n
		}
		if n, err := strconv.ParseUint(v, 0, 64); err == nil {
			return int64(n) // e.g. NFS4_UINT64_MAX; compared bit for bit.
		}
		cur = v
	}
	t.Fatalf("%s: definition chain too deep", name)
	return 0
}

// arms returns the case label -> arm name ("" for void) of a union.
func (s *spec) arms(t *testing.T, union string) map[string]string {
	t.Helper()
	body, ok := s.unions[union]
	if !ok {
		t.Fatalf("union %s not found", union)
	}
	out := map[string]string{}
	for _, m := range caseRE.FindAllStringSubmatch(body, -1) {
		out[m[1]] = m[3]
	}
	return out
}

// fields returns the field names of a struct in order.
func (s *spec) fields(t *testing.T, name string) []string {
	t.Helper()
	body, ok := s.structs[name]
	if !ok {
		t.Fatalf("struct %s not found", name)
	}
	var out []string
	for _, m := range fieldRE.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestProtocolNumbers(t *testing.T) {
	s := load(t)
	// Values as published in RFC 5662 / RFC 7863 (NFSv4.1/4.2), RFC 8276
	// (xattrs), RFC 8275 (umask) and RFC 8435 (flexfiles).
	want := map[string]int64{
		// Sizes.
		"NFS4_FHSIZE":         128,
		"NFS4_VERIFIER_SIZE":  8,
		"NFS4_OTHER_SIZE":     12,
		"NFS4_OPAQUE_LIMIT":   1024,
		"NFS4_SESSIONID_SIZE": 16,
		"NFS4_DEVICEID4_SIZE": 16,
		"NFS4_UINT64_MAX":     -1,
		"NFS4_MAXFILEOFF":     -2,

		// Operation numbers.
		"OP_ACCESS":               3,
		"OP_CLOSE":                4,
		"OP_GETATTR":              9,
		"OP_GETFH":                10,
		"OP_LOOKUP":               15,
		"OP_OPEN":                 18,
		"OP_PUTFH":                22,
		"OP_PUTROOTFH":            24,
		"OP_READ":                 25,
		"OP_READDIR":              26,
		"OP_SETATTR":              34,
		"OP_WRITE":                38,
		"OP_RELEASE_LOCKOWNER":    39,
		"OP_BACKCHANNEL_CTL":      40,
		"OP_BIND_CONN_TO_SESSION": 41,
		"OP_EXCHANGE_ID":          42,
		"OP_CREATE_SESSION":       43,
		"OP_DESTROY_SESSION":      44,
		"OP_FREE_STATEID":         45,
		"OP_GET_DIR_DELEGATION":   46,
		"OP_GETDEVICEINFO":        47,
		"OP_GETDEVICELIST":        48,
		"OP_LAYOUTCOMMIT":         49,
		"OP_LAYOUTGET":            50,
		"OP_LAYOUTRETURN":         51,
		"OP_SECINFO_NO_NAME":      52,
		"OP_SEQUENCE":             53,
		"OP_SET_SSV":              54,
		"OP_TEST_STATEID":         55,
		"OP_WANT_DELEGATION":      56,
		"OP_DESTROY_CLIENTID":     57,
		"OP_RECLAIM_COMPLETE":     58,
		"OP_ALLOCATE":             59,
		"OP_COPY":                 60,
		"OP_COPY_NOTIFY":          61,
		"OP_DEALLOCATE":           62,
		"OP_IO_ADVISE":            63,
		"OP_LAYOUTERROR":          64,
		"OP_LAYOUTSTATS":          65,
		"OP_OFFLOAD_CANCEL":       66,
		"OP_OFFLOAD_STATUS":       67,
		"OP_READ_PLUS":            68,
		"OP_SEEK":                 69,
		"OP_WRITE_SAME":           70,
		"OP_CLONE":                71,
		"OP_GETXATTR":             72,
		"OP_SETXATTR":             73,
		"OP_LISTXATTRS":           74,
		"OP_REMOVEXATTR":          75,
		"OP_ILLEGAL":              10044,

		// Callback operation numbers.
		"OP_CB_GETATTR":              3,
		"OP_CB_RECALL":               4,
		"OP_CB_LAYOUTRECALL":         5,
		"OP_CB_NOTIFY":               6,
		"OP_CB_PUSH_DELEG":           7,
		"OP_CB_RECALL_ANY":           8,
		"OP_CB_RECALLABLE_OBJ_AVAIL": 9,
		"OP_CB_RECALL_SLOT":          10,
		"OP_CB_SEQUENCE":             11,
		"OP_CB_WANTS_CANCELLED":      12,
		"OP_CB_NOTIFY_LOCK":          13,
		"OP_CB_NOTIFY_DEVICEID":      14,
		"OP_CB_OFFLOAD":              15,
		"OP_CB_ILLEGAL":              10044,

		// Status codes.
		"NFS4_OK":                           0,
		"NFS4ERR_PERM":                      1,
		"NFS4ERR_NOENT":                     2,
		"NFS4ERR_IO":                        5,
		"NFS4ERR_ACCESS":                    13,
		"NFS4ERR_EXIST":                     17,
		"NFS4ERR_NOTDIR":                    20,
		"NFS4ERR_ISDIR":                     21,
		"NFS4ERR_INVAL":                     22,
		"NFS4ERR_NOSPC":                     28,
		"NFS4ERR_NAMETOOLONG":               63,
		"NFS4ERR_NOTEMPTY":                  66,
		"NFS4ERR_STALE":                     70,
		"NFS4ERR_BADHANDLE":                 10001,
		"NFS4ERR_NOTSUPP":                   10004,
		"NFS4ERR_SERVERFAULT":               10006,
		"NFS4ERR_DELAY":                     10008,
		"NFS4ERR_DENIED":                    10010,
		"NFS4ERR_GRACE":                     10013,
		"NFS4ERR_STALE_CLIENTID":            10022,
		"NFS4ERR_BAD_STATEID":               10025,
		"NFS4ERR_NOFILEHANDLE":              10020,
		"NFS4ERR_MINOR_VERS_MISMATCH":       10021,
		"NFS4ERR_BADXDR":                    10036,
		"NFS4ERR_OP_ILLEGAL":                10044,
		"NFS4ERR_BADIOMODE":                 10049,
		"NFS4ERR_BADSESSION":                10052,
		"NFS4ERR_BADSLOT":                   10053,
		"NFS4ERR_COMPLETE_ALREADY":          10054,
		"NFS4ERR_CONN_NOT_BOUND_TO_SESSION": 10055,
		"NFS4ERR_LAYOUTTRYLATER":            10058,
		"NFS4ERR_LAYOUTUNAVAILABLE":         10059,
		"NFS4ERR_NOMATCHING_LAYOUT":         10060,
		"NFS4ERR_UNKNOWN_LAYOUTTYPE":        10062,
		"NFS4ERR_SEQ_MISORDERED":            10063,
		"NFS4ERR_SEQUENCE_POS":              10064,
		"NFS4ERR_REQ_TOO_BIG":               10065,
		"NFS4ERR_REP_TOO_BIG":               10066,
		"NFS4ERR_REP_TOO_BIG_TO_CACHE":      10067,
		"NFS4ERR_RETRY_UNCACHED_REP":        10068,
		"NFS4ERR_TOO_MANY_OPS":              10070,
		"NFS4ERR_OP_NOT_IN_SESSION":         10071,
		"NFS4ERR_CLIENTID_BUSY":             10074,
		"NFS4ERR_SEQ_FALSE_RETRY":           10076,
		"NFS4ERR_BAD_HIGH_SLOT":             10077,
		"NFS4ERR_DEADSESSION":               10078,
		"NFS4ERR_PNFS_NO_LAYOUT":            10080,
		"NFS4ERR_NOT_ONLY_OP":               10081,
		"NFS4ERR_WRONG_CRED":                10082,
		"NFS4ERR_DELEG_REVOKED":             10087,
		"NFS4ERR_PARTNER_NOTSUPP":           10088,
		"NFS4ERR_UNION_NOTSUPP":             10090,
		"NFS4ERR_OFFLOAD_NO_REQS":           10094,
		"NFS4ERR_NOXATTR":                   10095,
		"NFS4ERR_XATTR2BIG":                 10096,

		// Attribute numbers.
		"FATTR4_SUPPORTED_ATTRS":    0,
		"FATTR4_TYPE":               1,
		"FATTR4_FH_EXPIRE_TYPE":     2,
		"FATTR4_CHANGE":             3,
		"FATTR4_SIZE":               4,
		"FATTR4_FSID":               8,
		"FATTR4_LEASE_TIME":         10,
		"FATTR4_RDATTR_ERROR":       11,
		"FATTR4_ACL":                12,
		"FATTR4_FILEHANDLE":         19,
		"FATTR4_FILEID":             20,
		"FATTR4_MAXREAD":            30,
		"FATTR4_MAXWRITE":           31,
		"FATTR4_MODE":               33,
		"FATTR4_NUMLINKS":           35,
		"FATTR4_OWNER":              36,
		"FATTR4_OWNER_GROUP":        37,
		"FATTR4_RAWDEV":             41,
		"FATTR4_SPACE_USED":         45,
		"FATTR4_TIME_ACCESS":        47,
		"FATTR4_TIME_METADATA":      52,
		"FATTR4_TIME_MODIFY":        53,
		"FATTR4_TIME_MODIFY_SET":    54,
		"FATTR4_MOUNTED_ON_FILEID":  55,
		"FATTR4_DACL":               58,
		"FATTR4_FS_LAYOUT_TYPES":    62,
		"FATTR4_LAYOUT_TYPES":       64,
		"FATTR4_LAYOUT_BLKSIZE":     65,
		"FATTR4_MODE_SET_MASKED":    74,
		"FATTR4_SUPPATTR_EXCLCREAT": 75,
		"FATTR4_FS_CHARSET_CAP":     76,
		"FATTR4_CLONE_BLKSIZE":      77,
		"FATTR4_SPACE_FREED":        78,
		"FATTR4_CHANGE_ATTR_TYPE":   79,
		"FATTR4_SEC_LABEL":          80,
		"FATTR4_MODE_UMASK":         81,
		"FATTR4_XATTR_SUPPORT":      82,

		// EXCHANGE_ID flags.
		"EXCHGID4_FLAG_SUPP_MOVED_REFER":    0x00000001,
		"EXCHGID4_FLAG_SUPP_MOVED_MIGR":     0x00000002,
		"EXCHGID4_FLAG_SUPP_FENCE_OPS":      0x00000004,
		"EXCHGID4_FLAG_BIND_PRINC_STATEID":  0x00000100,
		"EXCHGID4_FLAG_USE_NON_PNFS":        0x00010000,
		"EXCHGID4_FLAG_USE_PNFS_MDS":        0x00020000,
		"EXCHGID4_FLAG_USE_PNFS_DS":         0x00040000,
		"EXCHGID4_FLAG_MASK_PNFS":           0x00070000,
		"EXCHGID4_FLAG_UPD_CONFIRMED_REC_A": 0x40000000,
		"EXCHGID4_FLAG_CONFIRMED_R":         0x80000000,

		// CREATE_SESSION flags.
		"CREATE_SESSION4_FLAG_PERSIST":        0x1,
		"CREATE_SESSION4_FLAG_CONN_BACK_CHAN": 0x2,
		"CREATE_SESSION4_FLAG_CONN_RDMA":      0x4,

		// SEQUENCE status flags.
		"SEQ4_STATUS_CB_PATH_DOWN":               0x1,
		"SEQ4_STATUS_CB_GSS_CONTEXTS_EXPIRING":   0x2,
		"SEQ4_STATUS_CB_GSS_CONTEXTS_EXPIRED":    0x4,
		"SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED":  0x8,
		"SEQ4_STATUS_EXPIRED_SOME_STATE_REVOKED": 0x10,
		"SEQ4_STATUS_ADMIN_STATE_REVOKED":        0x20,
		"SEQ4_STATUS_RECALLABLE_STATE_REVOKED":   0x40,
		"SEQ4_STATUS_LEASE_MOVED":                0x80,
		"SEQ4_STATUS_RESTART_RECLAIM_NEEDED":     0x100,
		"SEQ4_STATUS_CB_PATH_DOWN_SESSION":       0x200,
		"SEQ4_STATUS_BACKCHANNEL_FAULT":          0x400,
		"SEQ4_STATUS_DEVID_CHANGED":              0x800,
		"SEQ4_STATUS_DEVID_DELETED":              0x1000,

		// OPEN share bits and delegation wants.
		"OPEN4_SHARE_ACCESS_READ":             1,
		"OPEN4_SHARE_ACCESS_WRITE":            2,
		"OPEN4_SHARE_ACCESS_BOTH":             3,
		"OPEN4_SHARE_DENY_NONE":               0,
		"OPEN4_SHARE_DENY_READ":               1,
		"OPEN4_SHARE_DENY_WRITE":              2,
		"OPEN4_SHARE_DENY_BOTH":               3,
		"OPEN4_SHARE_ACCESS_WANT_DELEG_MASK":  0xFF00,
		"OPEN4_SHARE_ACCESS_WANT_NO_DELEG":    0x0400,
		"OPEN4_SHARE_ACCESS_WANT_CANCEL":      0x0500,
		"OPEN4_RESULT_CONFIRM":                0x2,
		"OPEN4_RESULT_LOCKTYPE_POSIX":         0x4,
		"OPEN4_RESULT_PRESERVE_UNLINKED":      0x8,
		"OPEN4_RESULT_MAY_NOTIFY_LOCK":        0x20,
		"OPEN4_SHARE_ACCESS_WANT_READ_DELEG":  0x0100,
		"OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG": 0x0200,

		// ACCESS bits (with the RFC 8276 xattr bits).
		"ACCESS4_READ":    0x01,
		"ACCESS4_LOOKUP":  0x02,
		"ACCESS4_MODIFY":  0x04,
		"ACCESS4_EXTEND":  0x08,
		"ACCESS4_DELETE":  0x10,
		"ACCESS4_EXECUTE": 0x20,
		"ACCESS4_XAREAD":  0x40,
		"ACCESS4_XAWRITE": 0x80,
		"ACCESS4_XALIST":  0x100,

		// Mode bits.
		"MODE4_SUID": 0o4000,
		"MODE4_SGID": 0o2000,
		"MODE4_SVTX": 0o1000,
		"MODE4_RUSR": 0o400,
		"MODE4_WUSR": 0o200,
		"MODE4_XUSR": 0o100,
		"MODE4_RGRP": 0o40,
		"MODE4_WGRP": 0o20,
		"MODE4_XGRP": 0o10,
		"MODE4_ROTH": 0o4,
		"MODE4_WOTH": 0o2,
		"MODE4_XOTH": 0o1,

		// Layouts.
		"LAYOUT4_NFSV4_1_FILES":           1,
		"LAYOUT4_OSD2_OBJECTS":            2,
		"LAYOUT4_BLOCK_VOLUME":            3,
		"LAYOUT4_FLEX_FILES":              4,
		"LAYOUTIOMODE4_READ":              1,
		"LAYOUTIOMODE4_RW":                2,
		"LAYOUTIOMODE4_ANY":               3,
		"LAYOUTRETURN4_FILE":              1,
		"LAYOUTRETURN4_FSID":              2,
		"LAYOUTRETURN4_ALL":               3,
		"LAYOUTRECALL4_FILE":              1,
		"LAYOUTRECALL4_ALL":               3,
		"NFL4_UFLG_MASK":                  0x3F,
		"NFL4_UFLG_DENSE":                 0x1,
		"NFL4_UFLG_COMMIT_THRU_MDS":       0x2,
		"NFL4_UFLG_STRIPE_UNIT_SIZE_MASK": 0xFFFFFFC0,
		"NFLH4_CARE_STRIPE_UNIT_SIZE":     0x40,
		"NFLH4_CARE_STRIPE_COUNT":         0x80,
		"NOTIFY_DEVICEID4_CHANGE":         1,
		"NOTIFY_DEVICEID4_DELETE":         2,
		"RCA4_TYPE_MASK_FILE_LAYOUT":      3,
		"RCA4_TYPE_MASK_FF_LAYOUT_MIN":    16,
		"RCA4_TYPE_MASK_FF_LAYOUT_MAX":    17,
		"FF_FLAGS_NO_LAYOUTCOMMIT":        0x1,
		"FF_FLAGS_NO_IO_THRU_MDS":         0x2,
		"FF_FLAGS_NO_READ_IO":             0x4,
		"FF_FLAGS_WRITE_ONE_MIRROR":       0x8,

		// Miscellaneous enums used on hot paths.
		"NF4REG":                    1,
		"NF4DIR":                    2,
		"NF4LNK":                    5,
		"NF4NAMEDATTR":              9,
		"UNSTABLE4":                 0,
		"FILE_SYNC4":                2,
		"EXCLUSIVE4_1":              3,
		"CLAIM_NULL":                0,
		"CLAIM_FH":                  4,
		"CLAIM_DELEG_PREV_FH":       6,
		"OPEN_DELEGATE_NONE_EXT":    3,
		"SP4_NONE":                  0,
		"SP4_MACH_CRED":             1,
		"SP4_SSV":                   2,
		"CDFC4_BACK_OR_BOTH":        7,
		"CDFS4_BOTH":                3,
		"NFS4_CONTENT_HOLE":         1,
		"SETXATTR4_REPLACE":         2,
		"AUTH_NONE":                 0,
		"AUTH_SYS":                  1,
		"RPCSEC_GSS":                6,
		"RPC_GSS_SVC_PRIVACY":       3,
		"FH4_VOLATILE_ANY":          0x2,
		"ACE4_GENERIC_READ":         0x00120081,
		"ACE4_GENERIC_WRITE":        0x00160106,
		"ACE4_GENERIC_EXECUTE":      0x001200A0,
		"ACL4_SUPPORT_ALLOW_ACL":    0x1,
		"WND4_IS_DIR":               8,
		"SECINFO_STYLE4_PARENT":     1,
		"NL4_NETADDR":               3,
		"IO_ADVISE4_INIT_PROXIMITY": 10,
	}
	for name, w := range want {
		if got := s.value(t, name); got != w {
			t.Errorf("%s = %#x, want %#x", name, got, w)
		}
	}
}

// TestStatusCodesComplete checks that nfsstat4 holds exactly the codes of
// NFSv4.0, 4.1, 4.2 and RFC 8276, with no gaps other than the ones the RFCs
// leave (19 and 10073 are unassigned; 3, 4, 7-12, ... are NFSv3-only).
func TestStatusCodesComplete(t *testing.T) {
	s := load(t)
	names := s.enums["nfsstat4"]
	got := map[int64]string{}
	for _, n := range names {
		v := s.value(t, n)
		if prev, dup := got[v]; dup {
			t.Errorf("nfsstat4 value %d used by %s and %s", v, prev, n)
		}
		got[v] = n
	}
	low := []int64{0, 1, 2, 5, 6, 13, 17, 18, 20, 21, 22, 27, 28, 30, 31, 63, 66, 69, 70}
	for _, v := range low {
		if _, ok := got[v]; !ok {
			t.Errorf("nfsstat4 has no code %d", v)
		}
	}
	for v := int64(10001); v <= 10096; v++ {
		_, ok := got[v]
		unassigned := v == 10002 || v == 10073
		if ok == unassigned {
			t.Errorf("nfsstat4 code %d: present=%v, want %v", v, ok, !unassigned)
		}
	}
	if want := len(low) + (10096 - 10001 + 1) - 2; len(names) != want {
		t.Errorf("nfsstat4 has %d codes, want %d", len(names), want)
	}
}

// TestAttributeNumbersComplete checks that FATTR4_* covers 0..82 with one
// constant each, and that each attribute has its fattr4_<name> typedef.
func TestAttributeNumbersComplete(t *testing.T) {
	s := load(t)
	byNum := map[int64]string{}
	for name := range s.raw {
		if !strings.HasPrefix(name, "FATTR4_") {
			continue
		}
		v := s.value(t, name)
		if prev, dup := byNum[v]; dup {
			t.Errorf("attribute %d defined as %s and %s", v, prev, name)
		}
		byNum[v] = name
		typ := "fattr4_" + strings.ToLower(strings.TrimPrefix(name, "FATTR4_"))
		if !regexp.MustCompile(`\btypedef\s+[A-Za-z_][A-Za-z0-9_ ]*\s+` + typ + `\b`).MatchString(s.text) {
			t.Errorf("%s has no typedef %s", name, typ)
		}
	}
	for v := int64(0); v <= 82; v++ {
		if _, ok := byNum[v]; !ok {
			t.Errorf("no FATTR4_* constant for attribute %d", v)
		}
	}
	if len(byNum) != 83 {
		t.Errorf("%d FATTR4_* constants, want 83", len(byNum))
	}
}

// TestCompoundArms checks that every operation number has an arm in both
// the argument and the result union of its COMPOUND, and pins the arm names
// that hand-written server and client code uses.
func TestCompoundArms(t *testing.T) {
	s := load(t)
	for _, tc := range []struct {
		opnum, argop, resop string
	}{
		{"nfs_opnum4", "nfs_argop4", "nfs_resop4"},
		{"nfs_cb_opnum4", "nfs_cb_argop4", "nfs_cb_resop4"},
	} {
		args, res := s.arms(t, tc.argop), s.arms(t, tc.resop)
		ops := s.enums[tc.opnum]
		if len(ops) == 0 {
			t.Fatalf("enum %s not found", tc.opnum)
		}
		for _, op := range ops {
			if _, ok := args[op]; !ok {
				t.Errorf("%s has no arm for %s", tc.argop, op)
			}
			if _, ok := res[op]; !ok {
				t.Errorf("%s has no arm for %s", tc.resop, op)
			}
		}
		if len(args) != len(ops) || len(res) != len(ops) {
			t.Errorf("%s: %d ops, %d arg arms, %d res arms", tc.opnum, len(ops), len(args), len(res))
		}
	}

	args, res := s.arms(t, "nfs_argop4"), s.arms(t, "nfs_resop4")
	wantArgs := map[string]string{
		"OP_ACCESS": "opaccess", "OP_GETATTR": "opgetattr", "OP_WRITE": "opwrite",
		"OP_READ": "opread", "OP_SEQUENCE": "opsequence", "OP_EXCHANGE_ID": "opexchange_id",
		"OP_CREATE_SESSION": "opcreate_session", "OP_LAYOUTGET": "oplayoutget",
		"OP_GETDEVICEINFO": "opgetdeviceinfo", "OP_COPY_NOTIFY": "opoffload_notify",
		"OP_SEEK": "opseek", "OP_GETXATTR": "opgetxattr", "OP_GETFH": "", "OP_ILLEGAL": "",
	}
	for op, arm := range wantArgs {
		if args[op] != arm {
			t.Errorf("nfs_argop4 arm for %s = %q, want %q", op, args[op], arm)
		}
	}
	wantRes := map[string]string{
		"OP_GETFH": "opgetfh", "OP_SEQUENCE": "opsequence", "OP_COPY_NOTIFY": "opcopy_notify",
		"OP_ILLEGAL": "opillegal",
	}
	for op, arm := range wantRes {
		if res[op] != arm {
			t.Errorf("nfs_resop4 arm for %s = %q, want %q", op, res[op], arm)
		}
	}
}

func TestFieldNames(t *testing.T) {
	s := load(t)
	for name, want := range map[string][]string{
		"SEQUENCE4args":       {"sa_sessionid", "sa_sequenceid", "sa_slotid", "sa_highest_slotid", "sa_cachethis"},
		"SEQUENCE4resok":      {"sr_sessionid", "sr_sequenceid", "sr_slotid", "sr_highest_slotid", "sr_target_highest_slotid", "sr_status_flags"},
		"stateid4":            {"seqid", "other"},
		"EXCHANGE_ID4args":    {"eia_clientowner", "eia_flags", "eia_state_protect", "eia_client_impl_id"},
		"channel_attrs4":      {"ca_headerpadsize", "ca_maxrequestsize", "ca_maxresponsesize", "ca_maxresponsesize_cached", "ca_maxoperations", "ca_maxrequests", "ca_rdma_ird"},
		"LAYOUTGET4args":      {"loga_signal_layout_avail", "loga_layout_type", "loga_iomode", "loga_offset", "loga_length", "loga_minlength", "loga_stateid", "loga_maxcount"},
		"authsys_parms":       {"stamp", "machinename", "uid", "gid", "gids"},
		"ff_layout4":          {"ffl_stripe_unit", "ffl_mirrors", "ffl_flags", "ffl_stats_collect_hint"},
		"ff_data_server4":     {"ffds_deviceid", "ffds_efficiency", "ffds_stateid", "ffds_fh_vers", "ffds_user", "ffds_group"},
		"ff_device_versions4": {"ffdv_version", "ffdv_minorversion", "ffdv_rsize", "ffdv_wsize", "ffdv_tightly_coupled"},
		"ff_device_addr4":     {"ffda_netaddrs", "ffda_versions"},
		"ff_mirror4":          {"ffm_data_servers"},
		"ff_ioerr4":           {"ffie_offset", "ffie_length", "ffie_stateid", "ffie_errors"},
		"ff_io_latency4":      {"ffil_ops_requested", "ffil_bytes_requested", "ffil_ops_completed", "ffil_bytes_completed", "ffil_bytes_not_delivered", "ffil_total_busy_time", "ffil_aggregate_completion_time"},
		"ff_layoutupdate4":    {"ffl_addr", "ffl_fhandle", "ffl_read", "ffl_write", "ffl_duration", "ffl_local"},
		"ff_iostats4":         {"ffis_offset", "ffis_length", "ffis_stateid", "ffis_read", "ffis_write", "ffis_deviceid", "ffis_layoutupdate"},
		"ff_layoutreturn4":    {"fflr_ioerr_report", "fflr_iostats_report"},
		"ff_layouthint4":      {"fflh_mirrors_hint"},
		"device_error4":       {"de_deviceid", "de_status", "de_opnum"},
		"LAYOUTERROR4args":    {"lea_offset", "lea_length", "lea_stateid", "lea_errors"},
		"LAYOUTSTATS4args":    {"lsa_offset", "lsa_length", "lsa_stateid", "lsa_read", "lsa_write", "lsa_deviceid", "lsa_layoutupdate"},
	} {
		if got := s.fields(t, name); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("struct %s fields = %v, want %v", name, got, want)
		}
	}
}

func TestPrograms(t *testing.T) {
	s := load(t)
	type proc struct{ name, num string }
	want := map[string]struct {
		prog, vers string
		procs      []proc
	}{
		"NFS4_PROGRAM":  {"100003", "4", []proc{{"NFSPROC4_NULL", "0"}, {"NFSPROC4_COMPOUND", "1"}}},
		"NFS4_CALLBACK": {"0x40000000", "1", []proc{{"CB_NULL", "0"}, {"CB_COMPOUND", "1"}}},
	}
	// Programs are split on the keyword so that the greedy body match of
	// programRE sees one program at a time.
	parts := strings.Split(s.text, "program ")
	found := 0
	for _, p := range parts[1:] {
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
		if m[3] != w.prog {
			t.Errorf("%s = %s, want %s", m[1], m[3], w.prog)
		}
		v := versionRE.FindStringSubmatch(m[2])
		if v == nil || v[3] != w.vers {
			t.Errorf("%s version = %v, want %s", m[1], v, w.vers)
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

// TestPlainSyntax checks the restrictions tools/xdrgen relies on: no rpcgen
// pass-through lines and no RFC extraction markers.
func TestPlainSyntax(t *testing.T) {
	for _, f := range specFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			trimmed := strings.TrimSpace(line)
			if strings.HasPrefix(trimmed, "%") || strings.HasPrefix(trimmed, "///") {
				t.Errorf("%s:%d: unsupported line %q", f, i+1, line)
			}
		}
	}
}

// TestRpcgen runs the reference XDR compiler over the concatenated files as
// an independent syntax check. It is skipped where rpcgen is not installed.
func TestRpcgen(t *testing.T) {
	rpcgen, err := exec.LookPath("rpcgen")
	if err != nil {
		t.Skip("rpcgen not installed")
	}
	var all []byte
	for _, f := range specFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	in := filepath.Join(t.TempDir(), "all.x")
	if err := os.WriteFile(in, all, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(rpcgen, "-h", in).CombinedOutput()
	if err != nil {
		t.Fatalf("rpcgen -h: %v\n%s", err, out)
	}
}
