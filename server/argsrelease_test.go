package server

import (
	"reflect"
	"slices"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestArgsNotRetainedAudit pins the audit behind the releaseArgs marks: decoded
// arguments alias the request only through []byte fields, and the allowed
// operations' arguments have exactly the byte fields that were audited. A
// new field (a changed spec or generator) or a new entry fails here until
// someone checks that its handler does not keep the bytes.
func TestArgsNotRetainedAudit(t *testing.T) {
	// The NfsArgop4 field holding each allowed operation's arguments; ""
	// for operations without arguments.
	argField := map[nfs4.NfsOpnum4]string{
		nfs4.OP_SEQUENCE:  "Opsequence",
		nfs4.OP_PUTFH:     "Opputfh",
		nfs4.OP_PUTROOTFH: "",
		nfs4.OP_GETFH:     "",
		nfs4.OP_SAVEFH:    "",
		nfs4.OP_RESTOREFH: "",
		nfs4.OP_GETATTR:   "Opgetattr",
		nfs4.OP_READ:      "Opread",
		nfs4.OP_WRITE:     "Opwrite",
		nfs4.OP_COMMIT:    "Opcommit",
	}
	audited := []string{"Opputfh.Object", "Opwrite.Data"}

	argop := reflect.TypeFor[nfs4.NfsArgop4]()
	var found []string
	for _, table := range []opTable{mdsOps, dsOps} {
		for op, d := range table {
			if !d.releaseArgs {
				continue
			}
			name, ok := argField[op]
			if !ok {
				t.Errorf("operation %v is allowed but not audited here", op)
				continue
			}
			if name == "" {
				continue
			}
			f, ok := argop.FieldByName(name)
			if !ok {
				t.Errorf("NfsArgop4 has no field %s", name)
				continue
			}
			found = append(found, byteFields(name, f.Type, 0)...)
		}
	}
	slices.Sort(found)
	found = slices.Compact(found)
	if !slices.Equal(found, audited) {
		t.Errorf("byte fields of allowed operations = %v, audited %v: re-audit argsrelease.go", found, audited)
	}
}

// byteFields lists the paths of the fields of t that can alias the decoded
// input: byte slices, and anything holding them.
func byteFields(path string, t reflect.Type, depth int) []string {
	if depth > 8 {
		return []string{path + " (too deep)"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return byteFields(path, t.Elem(), depth+1)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return []string{path}
		}
		return byteFields(path+"[]", t.Elem(), depth+1)
	case reflect.Array:
		return byteFields(path+"[]", t.Elem(), depth+1)
	case reflect.Struct:
		var out []string
		for i := range t.NumField() {
			f := t.Field(i)
			out = append(out, byteFields(path+"."+f.Name, f.Type, depth+1)...)
		}
		return out
	case reflect.Map, reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return []string{path + " (" + t.Kind().String() + ")"}
	}
	return nil // numbers, bools, strings (decoded as copies)
}
