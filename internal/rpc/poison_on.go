//go:build rpcpoison

package rpc

// poisonReleased: see poison_off.go. This build poisons released record
// buffers so a use after release shows up as corrupted data in tests.
var poisonReleased = true
