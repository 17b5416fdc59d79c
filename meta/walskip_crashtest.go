//go:build shoal_crashtest

package meta

import "os"

// skipWALSync, only in binaries built with the shoal_crashtest tag and
// only when SHOAL_TEST_SKIP_WAL_FSYNC=1, makes the write-ahead log's
// fdatasync a no-op: changes are answered as durable while they are only
// in the page cache. The machine-crash harness (test/crash) runs a server
// built this way to show that it catches the loss; nothing else may.
var skipWALSync = os.Getenv("SHOAL_TEST_SKIP_WAL_FSYNC") == "1"
