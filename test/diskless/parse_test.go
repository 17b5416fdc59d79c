package diskless

import (
	"strings"
	"testing"
)

// A report as scripts/diskless.sh boot prints it (shortened), and one of
// each way a boot can fall short: check must pass the first and fail
// every other.
const goodReport = `NODE node0 ok first_line_s=18.69 done_s=20.21 wire_rx_bytes=30890810
  node0: 18.69 DISKLESS first-line host=node0 uptime=10.35 init=/usr/lib/systemd/systemd kernel=6.1.0-56-amd64
  node0: 19.85 DISKLESS python ok python 3.11.2 /usr/bin/python3.11 6834488 bytes sha256 6d97
  node0: 19.89 DISKLESS mountstats 	nfsv4:	bm0=0xfcffafff,sessions,pnfs=LAYOUT_NFSV4_1_FILES,lease_time=15
  node0: 19.90 DISKLESS state ok node0 booted at uptime 10.35
  node0: 19.91 DISKLESS root-ro read-only
SERVER mds read_bytes=558805 write_bytes=0 READ=191 LAYOUTGET=225 GETDEVICEINFO=1
SERVER ds0 read_bytes=7839304 write_bytes=0 READ=108 LAYOUTGET=0 GETDEVICEINFO=0
SERVER ds1 read_bytes=10301312 write_bytes=0 READ=131 LAYOUTGET=0 GETDEVICEINFO=0
SERVER ds2 read_bytes=10102048 write_bytes=0 READ=123 LAYOUTGET=0 GETDEVICEINFO=0
RESULT target=shoal nodes=1 ok=1 kernel=6.1.0-56-amd64 copy_s=11.4 boot_s=22.0 total_s=46.1
`

// recorder is a testing.TB stand-in that only counts errors.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, format)
}

func TestCheckReportKilled(t *testing.T) {
	killed := strings.Replace(goodReport, "SERVER ds0 read_bytes=7839304 write_bytes=0 READ=108 LAYOUTGET=0 GETDEVICEINFO=0", "SERVER ds0 down", 1)
	rec := &recorder{TB: t}
	checkTB(rec, parse(killed), 1, true)
	if len(rec.errs) != 0 {
		t.Errorf("a boot that rode through the kill: %q", rec.errs)
	}
	rec = &recorder{TB: t}
	checkTB(rec, parse(killed), 1, false)
	if len(rec.errs) == 0 {
		t.Error("a data server down without a kill passed")
	}
	rec = &recorder{TB: t}
	checkTB(rec, parse(goodReport), 1, true)
	if len(rec.errs) == 0 {
		t.Error("a kill that did not happen passed")
	}
}

func TestCheckReport(t *testing.T) {
	for _, tc := range []struct {
		name, from, to string
	}{
		{"good", "", ""},
		{"no pnfs", "pnfs=LAYOUT_NFSV4_1_FILES", "pnfs=not configured"},
		{"busybox init", "init=/usr/lib/systemd/systemd", "init=/bin/busybox"},
		{"python failed", "DISKLESS python ok", "DISKLESS python failed"},
		{"data server idle", "ds1 read_bytes=10301312 write_bytes=0 READ=131", "ds1 read_bytes=0 write_bytes=0 READ=0"},
		{"no layouts", "LAYOUTGET=225", "LAYOUTGET=0"},
		{"node did not finish", "ok=1 kernel", "ok=0 kernel"},
		{"root writable", "root-ro read-only", "root-ro WRITABLE"},
		{"no state", "DISKLESS state ok node0", "DISKLESS state failed node0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := goodReport
			if tc.from != "" {
				if !strings.Contains(rep, tc.from) {
					t.Fatalf("report has no %q", tc.from)
				}
				rep = strings.Replace(rep, tc.from, tc.to, 1)
			}
			rec := &recorder{TB: t}
			checkTB(rec, parse(rep), 1, false)
			if (len(rec.errs) == 0) != (tc.from == "") {
				t.Errorf("check found %d problems: %q", len(rec.errs), rec.errs)
			}
		})
	}
}
