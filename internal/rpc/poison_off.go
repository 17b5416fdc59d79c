//go:build !rpcpoison

package rpc

// poisonReleased makes released record buffers be overwritten with
// poisonByte, and checked for writes when reused. It costs a pass over each
// buffer, so it is off unless built with the rpcpoison tag:
//
//	go test -tags rpcpoison ./...
//
// The package's own tests turn it on regardless (see TestMain).
var poisonReleased = false
