package statuspage

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fakeSource hands out a fixed snapshot, or an error.
type fakeSource struct {
	s   *Snapshot
	err error
}

func (f fakeSource) Snapshot(context.Context) (*Snapshot, error) { return f.s, f.err }

var now = time.Date(2026, 11, 24, 13, 30, 0, 0, time.UTC)

// cluster is a snapshot with one data server of each kind, a client with
// a hostile owner, an unavailable file and events.
func cluster() *Snapshot {
	return &Snapshot{
		Time: now, ClusterID: "c0ffee", MDS: "127.0.0.1:2049",
		DataServers: []DataServer{
			{ID: "ds-aaa", Addrs: []string{"127.0.0.1:4001"}, State: "active", Up: true, Since: now.Add(-5 * time.Minute),
				LastBeat: now.Add(-time.Second), Capacity: 100 << 30, Free: 75 << 30, Files: 3, Bytes: 3 << 20,
				ReadRate: 1.5 * (1 << 20), WriteRate: 512},
			{ID: "ds-bbb", Addrs: []string{"127.0.0.1:4002"}, State: "active", Up: false, Since: now.Add(-20 * time.Second),
				LastBeat: now.Add(-21 * time.Second), Capacity: 100 << 30, Free: 50 << 30, Files: 2, Bytes: 2 << 20, ReadRate: 7},
			{ID: "ds-ccc", Addrs: []string{"127.0.0.1:4003"}, State: "draining", Up: true, Since: now.Add(-2 * time.Hour),
				LastBeat: now, Capacity: 100 << 30, Free: 100 << 30},
		},
		Clients: []Client{
			{ID: "6543210f00000001", Owner: "<script>alert(1)</script>", Principal: "sys:0", Addrs: []string{"127.0.0.1:50000"},
				Confirmed: true, Sessions: []string{"6543210f000000010000000100000002"}, LeaseExpires: now.Add(85 * time.Second), Opens: 2, Layouts: 2, Recalling: 1},
			{ID: "6543210f00000002", Owner: "linux", Confirmed: true, Fenced: true, LeaseExpires: now.Add(-time.Second), Layouts: 1},
		},
		Files: Files{Placed: 5, UnavailableCount: 2, Unavailable: []UnavailableFile{{Ino: 42, Down: []string{"ds-bbb"}}, {Ino: 43, Down: []string{"ds-bbb"}}}},
		Events: []Event{
			{Time: now.Add(-20 * time.Second), Kind: "ds left", Subject: "ds-bbb", Count: 1},
			{Time: now.Add(-time.Minute), Kind: "layout recall", Subject: "6543210f00000001", Detail: "inode 42", Count: 3},
		},
	}
}

func TestHandler(t *testing.T) {
	for _, tt := range []struct {
		name, method, path string
		src                fakeSource
		wantStatus         int
		wantType           string
		want, wantNot      []string // substrings of the body
	}{
		{
			name: "page", path: "/", src: fakeSource{s: cluster()}, wantStatus: 200, wantType: "text/html",
			want: []string{
				`<tr data-ds="ds-aaa" data-up="true">`,
				`<tr data-ds="ds-bbb" data-up="false" class="down">`,
				`<tr data-ds="ds-ccc" data-up="true">`,
				`<span class="pill down">down</span> <span class="muted">20 s</span>`,
				`<span class="state state-draining">draining</span>`,
				`25 GiB of 100 GiB`, `1.5 MiB/s`, `512 B/s`,
				`<span class="value" id="sum-ds">2 / 3 up</span>`,
				`<span class="value" id="sum-read">1.5 MiB/s</span>`,
				`<span class="value" id="sum-layouts">3</span>`,
				`class="card bad" id="card-unavailable"`,
				`&lt;script&gt;alert(1)&lt;/script&gt;`,
				`in 1 min`, `expired`, `recalling 1`, `fenced`,
				`<code class="session" title="6543210f000000010000000100000002">…00000002</code>`,
				`<td><code>42</code></td><td>ds-bbb</td>`,
				`inode 42 <span class="muted">×3</span>`,
				`<time datetime="2026-11-24T13:29:40Z">13:29:40</time>`,
				`static/status.js`,
			},
			// A down data server's last rates are not its throughput.
			wantNot: []string{`<script>alert(1)`, `7 B/s`},
		},
		{
			name: "empty cluster", path: "/", src: fakeSource{s: &Snapshot{Time: now, MDS: "m:1"}}, wantStatus: 200, wantType: "text/html",
			want: []string{"No data server has registered yet.", "No client is connected.", "Every file is available.",
				"Nothing has happened yet.", `<span class="value" id="sum-ds">0 / 0 up</span>`},
		},
		{
			name: "warnings", path: "/", src: fakeSource{s: &Snapshot{Time: now, Warnings: []string{"files: etcd is away"}}},
			wantStatus: 200, wantType: "text/html", want: []string{`<p class="warning">files: etcd is away</p>`},
		},
		{
			name: "json", path: "/status.json", src: fakeSource{s: cluster()}, wantStatus: 200, wantType: "application/json",
			want: []string{`"id":"ds-bbb"`, `"up":false`, `"read_rate":1572864`, `"unavailable_count":2`},
		},
		{name: "script", path: "/static/status.js", src: fakeSource{}, wantStatus: 200, wantType: "text/javascript", want: []string{"status.json"}},
		{name: "style sheet", path: "/static/status.css", src: fakeSource{}, wantStatus: 200, wantType: "text/css"},
		{name: "unknown page", path: "/nope", src: fakeSource{s: cluster()}, wantStatus: 404},
		{name: "unknown static file", path: "/static/nope.js", src: fakeSource{}, wantStatus: 404},
		{name: "post", method: "POST", path: "/", src: fakeSource{s: cluster()}, wantStatus: 405},
		{
			name: "source fails, page", path: "/", src: fakeSource{err: errors.New("meta: bolt is closed")},
			wantStatus: 503, want: []string{"cluster status unavailable: meta: bolt is closed"},
		},
		{name: "source fails, json", path: "/status.json", src: fakeSource{err: errors.New("boom")}, wantStatus: 503},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(Handler(tt.src, slog.New(slog.DiscardHandler)))
			defer srv.Close()
			req, err := http.NewRequest(cmpOr(tt.method, "GET"), srv.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			body := string(b)
			if res.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, tt.wantStatus, body)
			}
			if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, tt.wantType) {
				t.Errorf("Content-Type %q, want %q", ct, tt.wantType)
			}
			for _, w := range tt.want {
				if !strings.Contains(body, w) {
					t.Errorf("body lacks %q:\n%s", w, body)
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(body, w) {
					t.Errorf("body has %q", w)
				}
			}
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestJSONRoundTrip: status.json is the snapshot, field for field.
func TestJSONRoundTrip(t *testing.T) {
	srv := httptest.NewServer(Handler(fakeSource{s: cluster()}, nil))
	defer srv.Close()
	res, err := http.Get(srv.URL + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got Snapshot
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if want := cluster(); !reflect.DeepEqual(&got, want) {
		t.Errorf("got  %+v\nwant %+v", got, *want)
	}
}

func TestFormat(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{formatBytes(0), "0 B"},
		{formatBytes(1023), "1023 B"},
		{formatBytes(1024), "1.0 KiB"},
		{formatBytes(1536), "1.5 KiB"},
		{formatBytes(10 << 20), "10 MiB"},
		{formatBytes(1 << 62), "4.0 EiB"},
		{formatRate(0), "0 B/s"},
		{formatRate(-3), "0 B/s"},
		{formatRate(2.4 * (1 << 30)), "2.4 GiB/s"},
		{formatAgo(time.Time{}, now), "never"},
		{formatAgo(now.Add(-59*time.Second), now), "59 s ago"},
		{formatAgo(now.Add(time.Second), now), "0 s ago"},
		{formatAgo(now.Add(-3*time.Hour), now), "3 h ago"},
		{formatAgo(now.Add(-49*time.Hour), now), "2 d ago"},
		{formatUntil(now.Add(90*time.Second), now), "in 1 min"},
		{formatUntil(now, now), "expired"},
		{formatClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))), "02:04:05"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
	for _, tt := range []struct {
		capacity, free uint64
		want           int
	}{{0, 0, 0}, {100, 100, 0}, {100, 25, 75}, {100, 200, 0}, {3, 1, 67}} {
		if got := usedPercent(tt.capacity, tt.free); got != tt.want {
			t.Errorf("usedPercent(%d, %d) = %d, want %d", tt.capacity, tt.free, got, tt.want)
		}
	}
}

func TestEventLog(t *testing.T) {
	type add struct {
		after                 time.Duration // since the previous event
		kind, subject, detail string
	}
	type want struct {
		kind, subject string
		count         int
	}
	for _, tt := range []struct {
		name string
		max  int
		adds []add
		want []want // newest first
	}{
		{"newest first", 10,
			[]add{{0, "ds joined", "a", ""}, {time.Second, "ds joined", "b", ""}},
			[]want{{"ds joined", "b", 1}, {"ds joined", "a", 1}}},
		{"repeats merge and move up", 10,
			[]add{{0, "layout recall", "c1", "inode 7"}, {time.Second, "ds left", "a", ""}, {time.Second, "layout recall", "c1", "inode 7"}},
			[]want{{"layout recall", "c1", 2}, {"ds left", "a", 1}}},
		{"different detail does not merge", 10,
			[]add{{0, "layout recall", "c1", "inode 7"}, {time.Second, "layout recall", "c1", "inode 8"}},
			[]want{{"layout recall", "c1", 1}, {"layout recall", "c1", 1}}},
		{"old events do not merge", 10,
			[]add{{0, "ds left", "a", ""}, {mergeWindow, "ds left", "a", ""}},
			[]want{{"ds left", "a", 1}, {"ds left", "a", 1}}},
		{"bounded", 2,
			[]add{{0, "ds joined", "a", ""}, {time.Second, "ds joined", "b", ""}, {time.Second, "ds joined", "c", ""}},
			[]want{{"ds joined", "c", 1}, {"ds joined", "b", 1}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := NewEventLog(tt.max)
			at := now
			l.now = func() time.Time { return at }
			for _, a := range tt.adds {
				at = at.Add(a.after)
				l.Add(Event{Kind: a.kind, Subject: a.subject, Detail: a.detail})
			}
			got := l.Events()
			if len(got) != len(tt.want) {
				t.Fatalf("%d events, want %d: %+v", len(got), len(tt.want), got)
			}
			for i, w := range tt.want {
				if g := got[i]; g.Kind != w.kind || g.Subject != w.subject || g.Count != w.count {
					t.Errorf("event %d: %+v, want %+v", i, g, w)
				}
			}
			if got[0].Time != at {
				t.Errorf("newest event at %v, want %v", got[0].Time, at)
			}
		})
	}
}
