package meta_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// BenchmarkRemoveCPU measures the engine's CPU per remove of an empty
// file as the NFS server makes it under `shoal bench --workloads small
// --streams 4`, without the RPC layer: bbolt behind the write-ahead log
// and group commit as server.openMeta opens it, removes made under
// meta.Deferred (the server's mode: answered once the record is
// written; the sync, if any, is the COMPOUND's, not measured here), each
// with a replay record written and the previous one of its stream
// retired (server/replay.go), from streams goroutines, each in a
// directory of its own, and the orphans freed by FreeOrphans in batches
// of 64 from one more goroutine, as the server's freer does. The files
// are created just before, unmeasured, so that the log's overlay holds
// them as it does in the benchmark. cpu-µs/op is the process's CPU time
// (user and system) per remove and its free; it is less disturbed by
// other load than ns/op.
//
//	go test ./meta -run '^$' -bench RemoveCPU -benchtime 20000x -count 5
func BenchmarkRemoveCPU(b *testing.B) {
	for _, streams := range []int{1, 4} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			e := benchEngine(b, meta.BoltOptions{GroupCommit: true, WAL: true})
			ctx := meta.Deferred(context.Background())
			per := (b.N + streams - 1) / streams
			dirs := make([]meta.Ino, streams)
			for p := range dirs {
				d, _, err := e.Create(ctx, meta.RootIno, "d"+strconv.Itoa(p), meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, time.Time{})
				if err != nil {
					b.Fatal(err)
				}
				dirs[p] = d.Ino
				for i := range per {
					if _, _, err := e.Create(ctx, d.Ino, "f"+strconv.Itoa(i), meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{}); err != nil {
						b.Fatal(err)
					}
				}
			}
			orphans := make(chan meta.Ino, 1024)
			freed := make(chan error, 1)
			go func() {
				var batch []meta.Ino
				var err error
				flush := func() {
					if len(batch) > 0 && err == nil {
						err = e.FreeOrphans(ctx, batch)
					}
					batch = batch[:0]
				}
				for ino := range orphans {
					batch = append(batch, ino)
					if len(batch) == 64 {
						flush()
					}
				}
				flush()
				freed <- err
			}()
			cpu0 := processCPU(b)
			b.ResetTimer()
			var wg sync.WaitGroup
			errs := make(chan error, streams)
			for p := range streams {
				wg.Go(func() {
					var prev *meta.ReplayID
					for i := range per {
						w := &meta.ReplayWrite{Record: meta.ReplayRecord{
							ReplayID: meta.ReplayID{Key: meta.ReplayKey{Digest: [16]byte{byte(p), byte(i), byte(i >> 8), byte(i >> 16)}}, Writer: 1, Seq: uint64(p*per + i + 1)},
							Op:       18, // OP_REMOVE
						}}
						if prev != nil {
							w.Drop = []meta.ReplayID{*prev}
						}
						nd, _, err := e.Remove(meta.WithReplay(ctx, w), dirs[p], "f"+strconv.Itoa(i), time.Time{})
						if err != nil {
							errs <- err
							return
						}
						prev = &w.Record.ReplayID
						orphans <- nd.Ino
					}
				})
			}
			wg.Wait()
			close(orphans)
			if err := <-freed; err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(per*streams), "cpu-µs/op")
		})
	}
}

// processCPU is the CPU time (user and system) this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
