package pcopy

import "testing"

func TestParseJournal(t *testing.T) {
	hdr := journalHeader{Chunk: 1 << 20, Src: "/src dir", Target: "."}.String()
	for _, tc := range []struct {
		name   string
		body   string
		rel    string
		key    fileKey
		done   bool
		sum    string
		chunks int
		absent bool
	}{
		{name: "chunks", body: "c 10 5 0 \"a b\"\nc 10 5 4 \"a b\"\n", rel: "a b", key: fileKey{10, 5}, chunks: 2},
		{name: "done with sum", body: "c 10 5 0 \"x\"\nf 10 5 abcd \"x\"\n", rel: "x", key: fileKey{10, 5}, done: true, sum: "abcd", chunks: 1},
		{name: "done without sum", body: "f 10 5 - \"x\"\n", rel: "x", key: fileKey{10, 5}, done: true},
		{name: "torn last line", body: "c 10 5 0 \"x\"\nc 10 5 4 \"x", rel: "x", key: fileKey{10, 5}, chunks: 1},
		{name: "empty line of a resumed journal", body: "c 10 5 0 \"x\"\n\nc 10 5 4 \"x\"\n", rel: "x", key: fileKey{10, 5}, chunks: 2},
		{name: "source changed", body: "c 10 5 0 \"x\"\nc 11 6 0 \"x\"\n", rel: "x", key: fileKey{10, 5}, absent: true},
		{name: "garbage", body: "zzz\nc x y z \"x\"\n", rel: "x", key: fileKey{10, 5}, absent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := parseJournal([]byte(hdr + tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if st.hdr.Src != "/src dir" || st.hdr.Target != "." || st.hdr.Chunk != 1<<20 {
				t.Errorf("header %+v", st.hdr)
			}
			jf := st.file(tc.rel, tc.key)
			if tc.absent {
				if jf != nil {
					t.Fatalf("got %+v, want nothing", jf)
				}
				return
			}
			if jf == nil || jf.done != tc.done || jf.sum != tc.sum || len(jf.chunks) != tc.chunks {
				t.Fatalf("got %+v", jf)
			}
		})
	}
	for _, bad := range []string{"", "not a journal\n", journalMagic + " chunk=0 \"a\" \".\"\n", journalMagic + " chunk=1 a\n"} {
		if _, err := parseJournal([]byte(bad)); err == nil {
			t.Errorf("parseJournal(%q) succeeded", bad)
		}
	}
}
