package wiring

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// TestLayoutPolicyDirs runs a files export with a flexfiles directory
// (`shoal admin policy --layout flexfiles`, over the control protocol)
// beside a plain one, on 3 data servers with 2 copies: the policy is
// recorded on the files created below it and not on the others;
// fs_layout_types lists each directory's own type first and the export's
// root both; LAYOUTGET of the other type is NFS4ERR_LAYOUTUNAVAILABLE;
// Shoal's client rooted in each directory picks that directory's driver
// (with flexfiles it writes both copies itself and the data servers
// forward nothing; with files the data servers forward the second copy);
// and a recall names each file's own type.
func TestLayoutPolicyDirs(t *testing.T) {
	f := false
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{
		Dir: t.TempDir(), DataServers: 3, Listen: "127.0.0.1:0", Mirrors: 2,
		Exports: []*server.Export{{Path: "/", RootSquash: &f, Layout: server.LayoutFiles}},
		Lease:   30 * time.Second, HealInterval: time.Hour, Metrics: reg, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	mds := c.MDS.Addr.String()
	m := c.MDS.Server.Meta()

	root, err := client.Dial(ctxT(t), mds, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, d := range []string{"/flex", "/plain"} {
		if err := root.Mkdir(ctxT(t), d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	secret, err := cluster.ReadJoinSecret(c.MDS.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	flexName := "flexfiles"
	var pi cluster.PolicyInfo
	if err := cluster.CallAdmin(ctxT(t), mds, secret, "policy", cluster.AdminRequest{Path: "/flex", Layout: &flexName}, &pi); err != nil {
		t.Fatal(err)
	}
	if pi.Layout != "flexfiles" || pi.Mirrors != 2 || !pi.Inherited {
		t.Fatalf("policy of /flex: %+v", pi)
	}
	pi = cluster.PolicyInfo{}
	if err := cluster.CallAdmin(ctxT(t), mds, secret, "policy", cluster.AdminRequest{Path: "/"}, &pi); err != nil {
		t.Fatal(err)
	}
	if pi.Layout != "" || !slices.Equal(pi.LayoutsBelow, []string{"flexfiles"}) {
		t.Fatalf("policy of /: %+v", pi)
	}
	bad := "striped"
	if err := cluster.CallAdmin(ctxT(t), mds, secret, "policy", cluster.AdminRequest{Path: "/flex", Layout: &bad}, nil); err == nil {
		t.Fatal("layout \"striped\" accepted")
	}

	// Shoal's client rooted in each directory, 1 MiB written through
	// layouts, read back.
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	ino := map[string]meta.Ino{}
	for _, tc := range []struct {
		dir           string
		wantDSWritten uint64 // bytes the client sent the data servers
		wantForwarded bool   // the data servers forwarded copies
	}{
		{"/flex", 2 * uint64(len(data)), false},
		{"/plain", uint64(len(data)), true},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			forwardedBefore := sumMetric(t, reg, "shoal_ds_replica_write_bytes_total")
			cl, err := client.Dial(ctxT(t), mds, client.Options{Root: tc.dir})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			f, err := cl.Open(ctxT(t), "/file", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(data); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			st := cl.Stats()
			if st.DSWriteBytes != tc.wantDSWritten || st.MDSIOBytes != 0 {
				t.Fatalf("the client wrote %d bytes to data servers and %d through the MDS, want %d and 0",
					st.DSWriteBytes, st.MDSIOBytes, tc.wantDSWritten)
			}
			if forwarded := sumMetric(t, reg, "shoal_ds_replica_write_bytes_total") - forwardedBefore; (forwarded > 0) != tc.wantForwarded {
				t.Fatalf("the data servers forwarded %v bytes; want forwarding %v", forwarded, tc.wantForwarded)
			}
			f, err = cl.Open(ctxT(t), "/file", os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(f)
			f.Close()
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes (%v), differing: %v", len(got), err, !bytes.Equal(got, data))
			}
			d, err := m.Lookup(ctxT(t), meta.RootIno, tc.dir[1:])
			if err != nil {
				t.Fatal(err)
			}
			n, err := m.Lookup(ctxT(t), d.Ino, "file")
			if err != nil {
				t.Fatal(err)
			}
			ino[tc.dir] = n.Ino
		})
	}
	for dir, want := range map[string]meta.Layout{"/flex": meta.LayoutFlexFiles, "/plain": meta.LayoutDefault} {
		if p, err := m.Policy(ctxT(t), ino[dir]); err != nil || p.Layout != want {
			t.Fatalf("policy of %s/file: %+v, %v; want layout %v", dir, p, err, want)
		}
	}

	// The wire: fs_layout_types, LAYOUTGET of each type, recalls.
	// A client that stripes flexfiles mirrors, as Shoal's client placed
	// the file.
	wc := setupAs(t, mds, "layout-policy", []nfs4.NfsImplId4{{NiiDomain: []byte("shoal.dev"), NiiName: []byte("wire test")}})
	files, flex := nfs4.LAYOUT4_NFSV4_1_FILES, nfs4.LAYOUT4_FLEX_FILES
	for _, tc := range []struct {
		path []string
		want []nfs4.Layouttype4
	}{
		{nil, []nfs4.Layouttype4{files, flex}},
		{[]string{"flex"}, []nfs4.Layouttype4{flex, files}},
		{[]string{"plain"}, []nfs4.Layouttype4{files}},
		{[]string{"flex", "file"}, []nfs4.Layouttype4{flex, files}},
		{[]string{"plain", "file"}, []nfs4.Layouttype4{files}},
	} {
		if got := layoutTypesAt(t, wc, tc.path...); !slices.Equal(got, tc.want) {
			t.Errorf("fs_layout_types of /%v: %v, want %v", tc.path, got, tc.want)
		}
	}
	held := map[string][]byte{}
	for _, tc := range []struct {
		dir        string
		own, other nfs4.Layouttype4
	}{{"flex", flex, files}, {"plain", files, flex}} {
		open, fh := openIn(t, wc, tc.dir, "file")
		for _, typ := range []nfs4.Layouttype4{tc.other, tc.own} {
			res, err := wc.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTGET, Oplayoutget: &nfs4.LAYOUTGET4args{
				LogaLayoutType: typ, LogaIomode: nfs4.LAYOUTIOMODE4_RW, LogaLength: ^uint64(0), LogaMinlength: 4096,
				LogaStateid: open, LogaMaxcount: 1 << 16}}))
			want := nfs4.NFS4ERR_LAYOUTUNAVAILABLE
			if typ == tc.own {
				want = nfs4.NFS4_OK
			}
			if got := status(t, res, err); got != want {
				t.Fatalf("LAYOUTGET %v of /%s/file: %v, want %v", typ, tc.dir, got, want)
			}
		}
		held[tc.dir] = fh
	}
	// Truncating each file recalls the layout this client holds, by the
	// file's own type (the client answers NOMATCHING_LAYOUT, so the
	// truncation goes on).
	for _, dir := range []string{"/flex", "/plain"} {
		f, err := root.Open(ctxT(t), dir+"/file", os.O_RDWR|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	recalled := map[string]nfs4.Layouttype4{}
	for _, cb := range wc.CBCompounds() {
		for _, a := range cb.Argarray {
			if r := a.Opcblayoutrecall; r != nil && r.CloraRecall.LorLayout != nil {
				for dir, fh := range held {
					if bytes.Equal(r.CloraRecall.LorLayout.LorFh, fh) {
						recalled[dir] = r.CloraType
					}
				}
			}
		}
	}
	if recalled["flex"] != flex || recalled["plain"] != files {
		t.Fatalf("recalls by type: %v, want flex: %v, plain: %v", recalled, flex, files)
	}

	// "inherit" clears the directory's type: new files follow the
	// export, the earlier file keeps flexfiles.
	inherit := "inherit"
	pi = cluster.PolicyInfo{}
	if err := cluster.CallAdmin(ctxT(t), mds, secret, "policy", cluster.AdminRequest{Path: "/flex", Layout: &inherit}, &pi); err != nil {
		t.Fatal(err)
	}
	if pi.Layout != "" {
		t.Fatalf("policy of /flex after inherit: %+v", pi)
	}
	nf, err := root.Open(ctxT(t), "/flex/after", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	nf.Close()
	if got := layoutTypesAt(t, wc, "flex", "after"); !slices.Equal(got, []nfs4.Layouttype4{files}) {
		t.Fatalf("fs_layout_types of a file created after inherit: %v", got)
	}
	if got := layoutTypesAt(t, wc, "flex", "file"); !slices.Equal(got, []nfs4.Layouttype4{flex, files}) {
		t.Fatalf("fs_layout_types of the file created before inherit: %v", got)
	}
}

// layoutTypesAt reads fs_layout_types of the object at path below the root.
func layoutTypesAt(t *testing.T, cl *wiretest.Client, path ...string) []nfs4.Layouttype4 {
	t.Helper()
	ops := []nfs4.NfsArgop4{{Argop: nfs4.OP_PUTROOTFH}}
	for _, name := range path {
		ops = append(ops, nfs4.NfsArgop4{Argop: nfs4.OP_LOOKUP, Oplookup: &nfs4.LOOKUP4args{Objname: nfs4.Component4(name)}})
	}
	ops = append(ops, nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{
		AttrRequest: nfs4.Bitmap4{0, 1 << (nfs4.FATTR4_FS_LAYOUT_TYPES - 32)}}})
	res, err := cl.Compound(ops...)
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("GETATTR fs_layout_types of %v: %v", path, wiretest.Check(res))
	}
	vals := res.Resarray[len(res.Resarray)-1].Opgetattr.Resok4.ObjAttributes.AttrVals
	var types []nfs4.Layouttype4
	for i := 4; i+4 <= len(vals); i += 4 {
		types = append(types, nfs4.Layouttype4(uint32(vals[i])<<24|uint32(vals[i+1])<<16|uint32(vals[i+2])<<8|uint32(vals[i+3])))
	}
	return types
}

// openIn opens dir/name (no create) and returns the open stateid and the
// filehandle.
func openIn(t *testing.T, cl *wiretest.Client, dir, name string) (nfs4.Stateid4, []byte) {
	t.Helper()
	res, err := cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
		op(nfs4.NfsArgop4{Argop: nfs4.OP_LOOKUP, Oplookup: &nfs4.LOOKUP4args{Objname: nfs4.Component4(dir)}}),
		op(nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
			ShareAccess: nfs4.OPEN4_SHARE_ACCESS_BOTH | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
			Owner:       nfs4.OpenOwner4{Clientid: cl.ClientID, Owner: []byte("o-" + dir)},
			Openhow:     nfs4.Openflag4{Opentype: nfs4.OPEN4_NOCREATE},
			Claim:       nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(name))},
		}}),
		op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("OPEN %s/%s: %v", dir, name, wiretest.Check(res))
	}
	return res.Resarray[3].Opopen.Resok4.Stateid, res.Resarray[4].Opgetfh.Resok4.Object
}

// sumMetric adds up every series of the counter name.
func sumMetric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
