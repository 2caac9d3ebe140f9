package conformance

import (
	"encoding/json"
	"errors"
	"testing"
)

// TestSummaryNamesEachClauseStatus: -o json gives a script each clause's
// status in words and the failure's text, and the verdict.
func TestSummaryNamesEachClauseStatus(t *testing.T) {
	s := Summarise("team/orders:1", []Result{
		{Clause: "each message once", Spec: "§2"},
		{Clause: "STOP", Spec: "§4", Err: errors.New("consumed 3 after STOP")},
		{Clause: "reconnect", Spec: "§6", Skip: "needs a cut connection"},
	})
	out, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Image      string
		Conformant bool
		Clauses    []struct{ Clause, Status, Detail, Spec string }
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got.Image != "team/orders:1" || got.Conformant || len(got.Clauses) != 3 {
		t.Fatalf("summary %s", out)
	}
	for i, want := range [][2]string{{"ok", ""}, {"failed", "consumed 3 after STOP"}, {"skipped", "needs a cut connection"}} {
		if c := got.Clauses[i]; c.Status != want[0] || c.Detail != want[1] {
			t.Errorf("clause %d: %+v, want status %s detail %q", i, c, want[0], want[1])
		}
	}
	if Summarise("x", []Result{{Clause: "a"}}).Conformant != true {
		t.Error("all clauses kept, but not conformant")
	}
}
