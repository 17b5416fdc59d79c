package kernel

import (
	"slices"
	"testing"
	"time"
)

// These tests cover the shoal-failover driver's arithmetic without a VM.

func TestIOPause(t *testing.T) {
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	s := func(sec float64) time.Time { return at.Add(time.Duration(sec * float64(time.Second))) }
	tests := []struct {
		name        string
		detect      time.Duration
		io          []ioPoint
		end         time.Time
		wantPause   time.Duration
		wantResumed time.Duration
	}{
		{
			name:   "stops at the fault, resumes after the new leader",
			detect: 3 * time.Second,
			io: []ioPoint{{s(-0.2), 10}, {s(-0.1), 20}, {s(0.5), 20}, {s(2), 20}, {s(4), 20},
				{s(4.5), 30}, {s(4.6), 40}, {s(10), 50}},
			end: s(8), wantPause: 4500 * time.Millisecond, wantResumed: 4500 * time.Millisecond,
		},
		{
			name:   "never stops",
			detect: time.Second,
			io:     []ioPoint{{s(-0.1), 1}, {s(0.5), 2}, {s(1), 3}, {s(1.5), 4}, {s(2), 5}},
			end:    s(2), wantPause: 500 * time.Millisecond, wantResumed: time.Second,
		},
		{
			name:   "never resumes before the end",
			detect: time.Second,
			io:     []ioPoint{{s(-0.1), 1}, {s(1), 1}, {s(9), 2}},
			end:    s(5), wantPause: 0, wantResumed: -1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &foRound{at: at, detect: tt.detect, io: tt.io}
			pause, resumed := r.ioPause(tt.end)
			if pause != tt.wantPause || resumed != tt.wantResumed {
				t.Errorf("ioPause = %v, %v; want %v, %v", pause, resumed, tt.wantPause, tt.wantResumed)
			}
		})
	}
}

func TestThiefLines(t *testing.T) {
	at := time.Unix(1000, 0)
	th := &thief{}
	for _, l := range []string{
		"R 999000000000 denied ",
		"R 1001000000000 error lock /x: context deadline exceeded",
		"R 1002000000000 denied ",
		"R 1003000000000 error second",
		"garbage",
		"R 1004000000000 denied ",
	} {
		th.add(l)
	}
	if th.sum.denied != 3 || th.sum.granted != 0 || th.sum.errs != 2 {
		t.Errorf("summary %s, want denied 3, granted 0, errors 2", th.sum)
	}
	if th.sum.firstErr != "lock /x: context deadline exceeded" {
		t.Errorf("first error %q", th.sum.firstErr)
	}
	if n := th.sum.deniedAfter(at); n != 2 {
		t.Errorf("denied after the fault %d, want 2", n)
	}
	th.add("R 1005000000000 granted ")
	if th.sum.granted != 1 {
		t.Errorf("granted %d, want 1", th.sum.granted)
	}
}

func TestParseRPCEvents(t *testing.T) {
	out := "1000.5\t3\t2049\t0\t1\t0\t0\t0x1,0x2\t0,0\t\t\t\n" +
		"1000.6\t3\t900\t0\t1\t0\t0\t0x1\t1\t0,10052\t\t\n" +
		"1000.7\t\t\t\t\t\t\t\t\t\t" + foVIP + "\taa:bb:cc:dd:ee:ff\n" +
		"1000.8\t4\t2049\t1\t0\t0\t0\t\t\t\t\t\n"
	evs := parseRPCEvents(out)
	if len(evs) != 4 {
		t.Fatalf("%d events, want 4: %+v", len(evs), evs)
	}
	if !evs[0].fromGuest || len(evs[0].xids) != 2 || evs[0].msgtypes[1] != "0" {
		t.Errorf("call frame parsed as %+v", evs[0])
	}
	if evs[1].fromGuest || len(evs[1].statuses) != 2 || evs[1].statuses[1] != 10052 {
		t.Errorf("reply frame parsed as %+v", evs[1])
	}
	if evs[2].arpFrom != "aa:bb:cc:dd:ee:ff" {
		t.Errorf("ARP frame parsed as %+v", evs[2])
	}
	if !evs[3].syn || evs[3].ack || !evs[3].fromGuest {
		t.Errorf("SYN frame parsed as %+v", evs[3])
	}
}

func TestFORounds(t *testing.T) {
	tests := []struct {
		faults  []string
		rounds  string
		want    []string
		wantErr bool
	}{
		{faults: []string{"kill", "stop", "stepdown"}, rounds: "1", want: []string{"kill", "stop", "stepdown"}},
		{faults: []string{"kill", "stepdown"}, rounds: "2", want: []string{"kill.01", "stepdown.01", "kill.02", "stepdown.02"}},
		{faults: []string{"kill"}, rounds: "0", wantErr: true},
		{faults: []string{"kill"}, rounds: "x", wantErr: true},
		{faults: []string{"reboot"}, rounds: "1", wantErr: true},
		{faults: nil, rounds: "3", wantErr: true},
	}
	for _, tt := range tests {
		got, err := foRounds(tt.faults, tt.rounds)
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
			t.Errorf("foRounds(%q, %q) = %q, %v; want %q (error %v)", tt.faults, tt.rounds, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestMedianMax(t *testing.T) {
	tests := []struct {
		in               []float64
		wantMed, wantMax float64
	}{
		{in: []float64{3, 1, 2}, wantMed: 2, wantMax: 3},
		{in: []float64{4, 1, 2, 3}, wantMed: 2.5, wantMax: 4},
		// A round that never saw the event counts as the slowest.
		{in: []float64{1, -1, 2}, wantMed: 2, wantMax: -1},
		{in: []float64{-1, -1, 2}, wantMed: -1, wantMax: -1},
	}
	for _, tt := range tests {
		var ms []foTimes
		for _, v := range tt.in {
			ms = append(ms, foTimes{Detect: v})
		}
		med, mx := medianMax(ms, func(m foTimes) float64 { return m.Detect })
		if med != tt.wantMed || mx != tt.wantMax {
			t.Errorf("medianMax(%v) = %v, %v; want %v, %v", tt.in, med, mx, tt.wantMed, tt.wantMax)
		}
	}
}
