package failover

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// TestLinearizableModelReplayRecords: the model lets a surviving replay
// record answer one later delete of an absent name by the same client,
// and no more: a second such answer, another client's, or one with no
// exposing delete before it is a violation.
func TestLinearizableModelReplayRecords(t *testing.T) {
	put := func(c int, v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: linIn{Op: opPut, Key: "/k", Val: v, Client: c}, Call: call, Output: linOut{}, Return: ret}
	}
	del := func(c int, out linOut, call, ret int64) porcupine.Operation {
		out.Existed = true
		return porcupine.Operation{ClientId: c, Input: linIn{Op: opDel, Key: "/k", Client: c}, Call: call, Output: out, Return: ret}
	}
	get := func(c int, v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: linIn{Op: opGet, Key: "/k", Client: c}, Call: call, Output: linOut{Val: v}, Return: ret}
	}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"answered once from the record", []porcupine.Operation{
			put(0, "a", 0, 1), del(0, linOut{Exposing: true}, 2, 3), get(1, "", 4, 5), del(0, linOut{Uncertain: true}, 6, 7),
		}, true},
		{"answered twice", []porcupine.Operation{
			put(0, "a", 0, 1), del(0, linOut{Exposing: true}, 2, 3), get(1, "", 4, 5),
			del(0, linOut{Uncertain: true}, 6, 7), del(0, linOut{Uncertain: true}, 8, 9),
		}, false},
		{"another client's record", []porcupine.Operation{
			put(0, "a", 0, 1), del(0, linOut{Exposing: true}, 2, 3), get(1, "", 4, 5), del(1, linOut{Uncertain: true}, 6, 7),
		}, false},
		{"no exposing delete", []porcupine.Operation{
			put(0, "a", 0, 1), del(0, linOut{}, 2, 3), get(1, "", 4, 5), del(0, linOut{Uncertain: true}, 6, 7),
		}, false},
		{"a real delete uses no record", []porcupine.Operation{
			put(0, "a", 0, 1), del(0, linOut{Exposing: true}, 2, 3), put(1, "b", 4, 5),
			del(0, linOut{Uncertain: true}, 6, 7), del(0, linOut{Uncertain: true}, 8, 9),
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(linModel.ToModel(), tc.ops); got != tc.want {
				t.Errorf("linearizable = %v, want %v", got, tc.want)
			}
		})
	}
}
