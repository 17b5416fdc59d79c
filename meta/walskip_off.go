//go:build !shoal_crashtest

package meta

// skipWALSync is the crash harness's fault switch (walskip_crashtest.go):
// always off in a normal build, so the compiler drops it.
const skipWALSync = false
