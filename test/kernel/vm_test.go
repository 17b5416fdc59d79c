package kernel

import (
	"slices"
	"strings"
	"testing"
)

// These tests cover the driver's parsing and command construction; they
// always run (no VM) and take milliseconds.

func TestParser(t *testing.T) {
	tests := []struct {
		name       string
		console    string
		wantSteps  []stepResult
		wantResult string
		wantSums   []string
		crashpoint bool
	}{
		{
			name: "pass and fail with output",
			console: "[    0.000] Linux version 6.1\n" +
				"init: kernel 6.1.0-56-amd64\n" +
				"PASS mount 0.22s opts=rw,vers=4.1\n" +
				"  | size on NFS: got '4096', want '4097'\n" +
				"FAIL io/4097 size on NFS: got '4096', want '4097'\n" +
				"PASS rm\n" +
				"RESULT 2 passed, 1 failed\n",
			wantSteps: []stepResult{
				{name: "mount", pass: true, detail: "0.22s opts=rw,vers=4.1"},
				{name: "io/4097", detail: "size on NFS: got '4096', want '4097'",
					output: []string{"size on NFS: got '4096', want '4097'"}},
				{name: "rm", pass: true},
			},
			wantResult: "RESULT 2 passed, 1 failed",
		},
		{
			name: "crash sums and CRLF",
			console: "SUM small " + strings.Repeat("ab", 32) + "\r\n" +
				"SUM large " + strings.Repeat("cd", 32) + "\r\n" +
				"SUM bogus xyz\r\n" +
				"PASS crash/write 1.0s\r\n" +
				"CRASHPOINT\r\n" +
				"RESULT 1 passed, 0 failed\r\n",
			wantSteps:  []stepResult{{name: "crash/write", pass: true, detail: "1.0s"}},
			wantResult: "RESULT 1 passed, 0 failed",
			wantSums:   []string{"small", "large"},
			crashpoint: true,
		},
		{
			name:      "no result line",
			console:   "PASS mount\n[  12.3] nfs: server 10.0.2.2 not responding, still trying\n",
			wantSteps: []stepResult{{name: "mount", pass: true}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p parser
			for _, l := range strings.Split(tc.console, "\n") {
				p.line(l)
			}
			if len(p.res.steps) != len(tc.wantSteps) {
				t.Fatalf("steps = %+v, want %+v", p.res.steps, tc.wantSteps)
			}
			for i, got := range p.res.steps {
				want := tc.wantSteps[i]
				if got.name != want.name || got.pass != want.pass || got.detail != want.detail ||
					!slices.Equal(got.output, want.output) {
					t.Errorf("step %d = %+v, want %+v", i, got, want)
				}
			}
			if p.res.result != tc.wantResult {
				t.Errorf("result = %q, want %q", p.res.result, tc.wantResult)
			}
			if !slices.Equal(p.res.sumOrder, tc.wantSums) {
				t.Errorf("sums = %v, want %v", p.res.sumOrder, tc.wantSums)
			}
			if p.res.crashpoint != tc.crashpoint {
				t.Errorf("crashpoint = %v, want %v", p.res.crashpoint, tc.crashpoint)
			}
		})
	}
}

func TestParseSetup(t *testing.T) {
	tests := []struct {
		name    string
		out     string
		want    images
		wantErr bool
	}{
		{
			name: "ok",
			out:  "KVER=6.1.0-56-amd64\nKERNEL=/c/vmlinuz\nINITRD=/c/initramfs-1.gz\n",
			want: images{kver: "6.1.0-56-amd64", kernel: "/c/vmlinuz", initrd: "/c/initramfs-1.gz"},
		},
		{
			name: "newest",
			out:  "KVER=7.2.13+deb14-amd64\nKERNEL=/c/vmlinuz\nINITRD=/c/initramfs-2.gz\n",
			want: images{kver: "7.2.13+deb14-amd64", kernel: "/c/vmlinuz", initrd: "/c/initramfs-2.gz"},
		},
		{name: "missing initrd", out: "KVER=6.1.0-56-amd64\nKERNEL=/c/vmlinuz\n", wantErr: true},
		{name: "missing kver", out: "KERNEL=/c/vmlinuz\nINITRD=/c/initramfs-1.gz\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSetup(tc.out)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The kernel level of the subtest names is the release's major.minor.
func TestImagesLabel(t *testing.T) {
	tests := []struct{ kver, want string }{
		{"6.1.0-56-amd64", "6.1"},
		{"7.2.13+deb14-amd64", "7.2"},
		{"10.0-rc1-amd64", "10.0"},
		{"custom", "custom"},
	}
	for _, tc := range tests {
		if got := (images{kver: tc.kver}).label(); got != tc.want {
			t.Errorf("label of %q = %q, want %q", tc.kver, got, tc.want)
		}
	}
}

func TestParseKernels(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "6.1", want: []string{"6.1"}},
		{in: "newest", want: []string{"newest"}},
		{in: "6.1,newest", want: []string{"6.1", "newest"}},
		{in: "newest, 6.1", want: []string{"newest", "6.1"}},
		{in: "6.1,6.1", wantErr: true},
		{in: "7.2", wantErr: true},
		{in: "sid", wantErr: true},
		{in: "6.1,", wantErr: true},
	}
	for _, tc := range tests {
		got, err := parseKernels(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("parseKernels(%q): err = %v, wantErr %v", tc.in, err, tc.wantErr)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("parseKernels(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestQemuArgs(t *testing.T) {
	c := bootConfig{
		img:     images{kernel: "/k", initrd: "/i"},
		params:  map[string]string{"t_vers": "4.2", "t_port": "2049", "t_host": "10.0.2.2"},
		capture: "/out/c.pcap",
	}
	args := qemuArgs(c)
	idx := slices.Index(args, "-append")
	if idx < 0 {
		t.Fatalf("no -append in %v", args)
	}
	wantCmdline := "console=ttyS0 panic=-1 quiet t_host=10.0.2.2 t_port=2049 t_vers=4.2"
	if args[idx+1] != wantCmdline {
		t.Errorf("cmdline = %q, want %q", args[idx+1], wantCmdline)
	}
	for _, want := range []string{"tcg,thread=multi", "-no-reboot", "filter-dump,id=f0,netdev=n0,file=/out/c.pcap"} {
		if !slices.Contains(args, want) {
			t.Errorf("args lack %q: %v", want, args)
		}
	}
	for _, w := range strings.Fields(args[idx+1]) {
		if k, _, ok := strings.Cut(w, "="); ok && strings.HasPrefix(k, "t_") && strings.Contains(k, ".") {
			t.Errorf("kernel parameter %q has a dot: the kernel would take it for a module parameter", k)
		}
	}
}

func TestExpandArgs(t *testing.T) {
	got := expandArgs("srv --listen 127.0.0.1:{port} --dir {dir}", 2049, "/d")
	want := []string{"srv", "--listen", "127.0.0.1:2049", "--dir", "/d"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
