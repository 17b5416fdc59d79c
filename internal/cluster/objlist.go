package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/store"
)

// Listing the objects of the data servers (OBJ_LIST), for the MDS's sweep
// of objects no file owns (server/sweep.go, meta.SweepMark): a create
// that a crash of the MDS took back may have left data on the data
// servers, where nothing but the object's name tells it is there. Striped
// lists every data server in service a page at a time and removes an
// object on the one data server that holds it.

// objPager is the store a data server lists its objects from
// (store.Local.Page).
type objPager interface {
	Page(after uint64, max int) (inos []uint64, eof bool, err error)
}

var _ objPager = (*store.Local)(nil)

// listPage is the page the MDS asks data servers for: 64 KiB of numbers.
const listPage = 8192

func (a *Agent) serveObjList(_ context.Context, _ *rpc.Call, args *ctlproto.CtlListArgs, res *xdr.Encoder) {
	out := a.objList(args)
	out.EncodeXDR(res)
}

func (a *Agent) objList(args *ctlproto.CtlListArgs) ctlproto.CtlListRes {
	p, ok := a.cfg.Store.(objPager)
	if !ok {
		return ctlproto.CtlListRes{Status: ctlproto.CTL_ERR_NOTSUPP}
	}
	if args.Count == 0 {
		return ctlproto.CtlListRes{Status: ctlproto.CTL_ERR_INVAL}
	}
	inos, eof, err := p.Page(args.After, int(min(args.Count, ctlproto.CTL_MAX_LIST)))
	if err != nil {
		a.log.Warn("cluster: list objects", "err", err)
		return ctlproto.CtlListRes{Status: ctlproto.CTL_ERR_IO}
	}
	return ctlproto.CtlListRes{Status: ctlproto.CTL_OK, Ok: &ctlproto.CtlListOk{Inos: inos, Eof: eof}}
}

var _ store.ObjectLister = (*Striped)(nil)

// ListObjects implements store.ObjectLister: the objects of every data
// server that is a member of the cluster (not removed), under its ID. A
// data server out of service is skipped and named in the error, after
// the others were listed, so the caller knows the listing is not
// complete.
func (s *Striped) ListObjects(ctx context.Context, fn func(place string, inos []uint64) error) error {
	var missed []error
	for _, ds := range s.r.DataServers() {
		if ds.State == Removed {
			continue
		}
		conn, err := s.r.conn(ds.ID)
		if err != nil {
			missed = append(missed, fmt.Errorf("data server %s not listed: %w", ds.ID, err))
			continue
		}
		if err := listDS(ctx, conn, ds.ID, fn); err != nil {
			var lerr *listError
			if !errors.As(err, &lerr) {
				return err // fn's, or ctx's
			}
			missed = append(missed, err)
		}
	}
	if len(missed) > 0 {
		return fmt.Errorf("cluster: list objects: %w", errors.Join(missed...))
	}
	return nil
}

// listError is a data server's failure to list (not the caller's fn's).
type listError struct {
	id  string
	err error
}

func (e *listError) Error() string {
	return fmt.Sprintf("data server %s: list objects: %v", e.id, e.err)
}
func (e *listError) Unwrap() error { return e.err }

// listDS pages through the objects of the data server id.
func listDS(ctx context.Context, conn *rpc.Conn, id string, fn func(place string, inos []uint64) error) error {
	var after uint64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var res ctlproto.CtlListRes
		if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_LIST, &ctlproto.CtlListArgs{After: after, Count: listPage}, &res); err != nil {
			return &listError{id, err}
		}
		if err := errOf(res.Status); err != nil {
			return &listError{id, err}
		}
		ok := res.Ok
		if len(ok.Inos) > 0 {
			if err := fn(id, ok.Inos); err != nil {
				return err
			}
			after = ok.Inos[len(ok.Inos)-1]
		} else if !ok.Eof {
			return &listError{id, errors.New("an empty page that is not the last")}
		}
		if ok.Eof {
			return nil
		}
	}
}

// RemoveObject implements store.ObjectLister: OBJ_REMOVE of ino on the
// data server place only. It takes the file's I/O lock, as Remove does.
func (s *Striped) RemoveObject(ctx context.Context, place string, ino uint64) error {
	defer s.lockIO(ino)()
	conn, err := s.r.conn(place)
	if err == nil {
		err = objRemove(ctx, conn, ino)
	}
	if err != nil {
		return fmt.Errorf("cluster: remove object %d on data server %s: %w", ino, place, err)
	}
	return nil
}
