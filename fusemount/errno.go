package fusemount

import (
	"context"
	"errors"
	"io/fs"
	"syscall"

	"github.com/shoalfs/shoal/client"
)

// errnoTable maps errors that carry no errno of their own to one; the first
// entry that errors.Is matches wins. Server statuses are handled before the
// table by client.StatusError.Errno, so this is the only other place an
// error becomes an errno.
var errnoTable = []struct {
	err   error
	errno syscall.Errno
}{
	{context.Canceled, syscall.EINTR},
	{context.DeadlineExceeded, syscall.ETIMEDOUT},
	{client.ErrClosed, syscall.EIO},
	{client.ErrVerifierChanged, syscall.EIO},
	{fs.ErrNotExist, syscall.ENOENT},
	{fs.ErrExist, syscall.EEXIST},
	{fs.ErrPermission, syscall.EACCES},
	{fs.ErrInvalid, syscall.EINVAL},
	{fs.ErrClosed, syscall.EBADF},
}

// toErrno converts an error from the client library into the errno the
// kernel passes to the application. Anything unrecognised is EIO.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var se *client.StatusError
	if errors.As(err, &se) {
		if e := se.Errno(); e != 0 {
			return e
		}
		return syscall.EIO
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	for _, m := range errnoTable {
		if errors.Is(err, m.err) {
			return m.errno
		}
	}
	return syscall.EIO
}
