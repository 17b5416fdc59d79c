package diskless

import (
	"strings"
	"testing"
)

// A boot --loop 60 --kill ds report (shortened), and one of each way a
// run can fall short: checkFaults must pass the first and fail every other.
const goodFaultReport = `NODE node0 ok first_line_s=17.61 done_s=81.92
  node0: 17.69 DISKLESS mountstats 	nfsv4:	bm0=0xfcffafff,sessions,pnfs=LAYOUT_NFSV4_1_FILES,lease_time=15
  node0: 18.20 DISKLESS loop start secs=60 t=14.18 files=/usr/bin/python3.11
  node0: 22.40 DISKLESS loop iter 1 t=18.40 took=4.20 lsR=2949 errors=0
  node0: 26.41 DISKLESS loop iter 2 t=22.41 took=4.01 lsR=2949 errors=0
  node0: 30.42 DISKLESS loop iter 3 t=26.42 took=4.01 lsR=2949 errors=0
  node0: 36.43 DISKLESS loop iter 4 t=32.43 took=6.01 lsR=2949 errors=0
  node0: 40.44 DISKLESS loop iter 5 t=36.44 took=4.01 lsR=2949 errors=0
  node0: 46.44 DISKLESS loop iter 6 t=42.44 took=6.00 lsR=2949 errors=0
  node0: 50.44 DISKLESS loop iter 7 t=46.44 took=4.00 lsR=2949 errors=0
  node0: 54.44 DISKLESS loop iter 8 t=50.44 took=4.00 lsR=2949 errors=0
  node0: 80.49 DISKLESS loop-summary iterations=8 errors=0 max_gap_s=6.01 max_iter_s=6.01 secs=62.31
STATE node0 node0 booted at uptime 11.51
FAULT killed ds0 (pid 31916, 233 READs served so far) at console 30.45 s, after iter 3
FAULT restarted ds0 10.0 s after the kill, at console 40.46 s
RESULT nodes=1 ok=1 kernel=6.1.0-56-amd64 copy_s=7.7 boot_s=84.8 total_s=98.4 loop=60 kill=ds load=4.91/4.31/8.03
`

func TestCheckFaultReport(t *testing.T) {
	for _, tc := range []struct {
		name, kind, from, to string
	}{
		{"good", "ds", "", ""},
		{"wrong kind", "mds", "", ""},
		{"no kill", "ds", "FAULT killed ds0", "FAULT none: node0's loop never reached round 3"},
		{"no restart", "ds", "FAULT restarted ds0", "FAULT gave up on ds0"},
		{"error line", "ds", "  node0: 36.43 DISKLESS loop iter 4", "  node0: 36.40 DISKLESS loop ERROR iter 4 t=32.40 md5sum exit 1: Input/output error\n  node0: 36.43 DISKLESS loop iter 4"},
		{"errors counted", "ds", "iterations=8 errors=0", "iterations=8 errors=1"},
		{"no summary", "ds", "DISKLESS loop-summary", "DISKLESS loop-stopped"},
		{"too few rounds", "ds", "iterations=8", "iterations=7"},
		{"round not logged", "ds", "  node0: 40.44 DISKLESS loop iter 5 t=36.44 took=4.01 lsR=2949 errors=0\n", ""},
		{"loop ended before the restart", "ds", "at console 40.46 s", "at console 90.46 s"},
		{"no pnfs", "ds", "pnfs=LAYOUT_NFSV4_1_FILES", "pnfs=not configured"},
		{"node did not finish", "ds", "ok=1 kernel", "ok=0 kernel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := goodFaultReport
			if tc.from != "" {
				if !strings.Contains(rep, tc.from) {
					t.Fatalf("report has no %q", tc.from)
				}
				rep = strings.Replace(rep, tc.from, tc.to, 1)
			}
			rec := &fatalRecorder{recorder: recorder{TB: t}}
			func() {
				defer func() { _ = recover() }()
				checkFaults(rec, parse(rep), tc.kind)
			}()
			good := tc.name == "good"
			if (len(rec.errs) == 0) != good {
				t.Errorf("check found %d problems: %q", len(rec.errs), rec.errs)
			}
		})
	}
}

// fatalRecorder also records Fatal, and stops the check as Fatal would.
type fatalRecorder struct{ recorder }

func (r *fatalRecorder) Fatal(args ...any) {
	r.errs = append(r.errs, "fatal")
	panic("fatal")
}

func (r *fatalRecorder) Logf(string, ...any) {}
