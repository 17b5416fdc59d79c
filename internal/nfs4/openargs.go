package nfs4

import "github.com/shoalfs/shoal/internal/xdr"

// This file is hand-written, not generated: the open_arguments attribute of
// RFC 9754 ("Extensions for Opening and Delegating Files in NFSv4.2",
// §4.2 and its XDR) is not in spec/nfs4.x, which holds RFC 7863 and
// RFC 8276 only (spec/spec_test.go pins the attribute numbers 0..82 there).
// Identifiers keep the RFC's names, including its mixed spelling of the
// createmode values (OPEN_ARGS_CREATEMODE_* and OPEN_ARGS_CREATE_MODE_*).

// FATTR4_OPEN_ARGUMENTS is the per-file-system, read-only, RECOMMENDED
// NFSv4.2 attribute that tells which OPEN arguments the server supports.
const FATTR4_OPEN_ARGUMENTS = 86

// OpenArguments4 is the XDR struct open_arguments4 (fattr4_open_arguments).
// Each bitmap holds, as bit numbers, the values of the matching
// open_args_* enum below that the server supports.
type OpenArguments4 struct {
	OaShareAccess     Bitmap4
	OaShareDeny       Bitmap4
	OaShareAccessWant Bitmap4
	OaOpenClaim       Bitmap4
	OaCreateMode      Bitmap4
}

// Fattr4OpenArguments is the type of FATTR4_OPEN_ARGUMENTS.
type Fattr4OpenArguments = OpenArguments4

// Values of open_args_share_access4: bits of oa_share_access.
const (
	OPEN_ARGS_SHARE_ACCESS_READ  = 1
	OPEN_ARGS_SHARE_ACCESS_WRITE = 2
	OPEN_ARGS_SHARE_ACCESS_BOTH  = 3
)

// Values of open_args_share_deny4: bits of oa_share_deny.
const (
	OPEN_ARGS_SHARE_DENY_NONE  = 0
	OPEN_ARGS_SHARE_DENY_READ  = 1
	OPEN_ARGS_SHARE_DENY_WRITE = 2
	OPEN_ARGS_SHARE_DENY_BOTH  = 3
)

// Values of open_args_share_access_want4: bits of oa_share_access_want.
const (
	OPEN_ARGS_SHARE_ACCESS_WANT_ANY_DELEG                     = 3
	OPEN_ARGS_SHARE_ACCESS_WANT_NO_DELEG                      = 4
	OPEN_ARGS_SHARE_ACCESS_WANT_CANCEL                        = 5
	OPEN_ARGS_SHARE_ACCESS_WANT_SIGNAL_DELEG_WHEN_RESRC_AVAIL = 17
	OPEN_ARGS_SHARE_ACCESS_WANT_PUSH_DELEG_WHEN_UNCONTENDED   = 18
	OPEN_ARGS_SHARE_ACCESS_WANT_DELEG_TIMESTAMPS              = 20
	OPEN_ARGS_SHARE_ACCESS_WANT_OPEN_XOR_DELEGATION           = 21
)

// Values of open_args_open_claim4: bits of oa_open_claim.
const (
	OPEN_ARGS_OPEN_CLAIM_NULL          = 0
	OPEN_ARGS_OPEN_CLAIM_PREVIOUS      = 1
	OPEN_ARGS_OPEN_CLAIM_DELEGATE_CUR  = 2
	OPEN_ARGS_OPEN_CLAIM_DELEGATE_PREV = 3
	OPEN_ARGS_OPEN_CLAIM_FH            = 4
	OPEN_ARGS_OPEN_CLAIM_DELEG_CUR_FH  = 5
	OPEN_ARGS_OPEN_CLAIM_DELEG_PREV_FH = 6
)

// Values of open_args_createmode4: bits of oa_create_mode.
const (
	OPEN_ARGS_CREATEMODE_UNCHECKED4    = 0
	OPEN_ARGS_CREATE_MODE_GUARDED      = 1
	OPEN_ARGS_CREATEMODE_EXCLUSIVE4    = 2
	OPEN_ARGS_CREATE_MODE_EXCLUSIVE4_1 = 3
)

// EncodeXDR implements xdr.Marshaler.
func (v *OpenArguments4) EncodeXDR(e *xdr.Encoder) {
	for _, bm := range v.bitmaps() {
		e.Uint32(uint32(len(*bm)))
		for _, w := range *bm {
			e.Uint32(w)
		}
	}
}

// DecodeXDR implements xdr.Unmarshaler.
func (v *OpenArguments4) DecodeXDR(d *xdr.Decoder) {
	for _, bm := range v.bitmaps() {
		*bm = nil
		n := d.ArrayLen(0, 4)
		if n == 0 || d.Err() != nil {
			continue
		}
		*bm = make(Bitmap4, n)
		for i := range *bm {
			if d.Err() != nil {
				break
			}
			(*bm)[i] = d.Uint32()
		}
	}
}

// bitmaps lists the fields in XDR order.
func (v *OpenArguments4) bitmaps() [5]*Bitmap4 {
	return [5]*Bitmap4{&v.OaShareAccess, &v.OaShareDeny, &v.OaShareAccessWant, &v.OaOpenClaim, &v.OaCreateMode}
}
