package state

import "testing"

// TestBeginRecallNew: BeginRecall says which layouts it started
// recalling (New), so that the server sends CB_LAYOUTRECALL for a layout
// granted after an earlier recall of the file even when it paces
// resending the callbacks to the holders it already told.
func TestBeginRecallNew(t *testing.T) {
	h := newHarness(t)
	m := h.m
	c, _ := h.client("c1")
	o := h.open(c, "o1", 7, AccessBoth, DenyNone)
	if _, err := m.LayoutGet(c, o, 7, IOModeRW); err != nil {
		t.Fatal(err)
	}
	if hs := m.BeginRecall(7); len(hs) != 1 || !hs[0].New {
		t.Fatalf("first BeginRecall = %+v, want one new holder", hs)
	}
	if hs := m.BeginRecall(7); len(hs) != 1 || hs[0].New {
		t.Fatalf("second BeginRecall = %+v, want the holder already told", hs)
	}
	if _, _, err := m.LayoutReturnFile(c, m.BeginRecall(7)[0].Stateid, 7); err != nil {
		t.Fatal(err)
	}
	// A layout granted after the recall ended is new to the next one.
	if _, err := m.LayoutGet(c, o, 7, IOModeRW); err != nil {
		t.Fatal(err)
	}
	if hs := m.BeginRecall(7); len(hs) != 1 || !hs[0].New {
		t.Fatalf("BeginRecall after a new grant = %+v, want one new holder", hs)
	}
}
