package report

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

func storedRecord(id string, age time.Duration, outcome Outcome) *Record {
	return &Record{
		ID: id, Strategy: "ms2m", Namespace: "default", Pod: "consumer", SourceNode: "node-a", TargetNode: "node-b",
		StartedAt: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC).Add(-age), Outcome: outcome,
		Phases: []PhaseTiming{{Name: Preflight, DurationMillis: 100, Steps: []Step{{Name: AgentsReady, DurationMillis: 90}}}},
	}
}

func TestStoreRoundTrip(t *testing.T) {
	client := fake.NewClientset()
	s := Store{Client: client}
	ctx := context.Background()
	a, b := storedRecord("x7k2p", 0, Succeeded), storedRecord("q9w8e", 3*time.Hour, RolledBack)
	for _, r := range []*Record{a, b} {
		if err := s.Save(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	a.Outcome = Committed
	if err := s.Save(ctx, a); err != nil { // saving again replaces
		t.Fatal(err)
	}
	list, err := s.List(ctx, "default")
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %d records, %v", len(list), err)
	}
	if list[0].ID != "x7k2p" || list[0].Outcome != Committed {
		t.Fatalf("newest first and updated: %+v", list[0])
	}
	got, err := s.Get(ctx, "default", "q9w")
	if err != nil || got.ID != "q9w8e" {
		t.Fatalf("prefix lookup: %v %v", got, err)
	}
	if _, err := s.Get(ctx, "default", "zzz"); err == nil || !strings.Contains(err.Error(), "kubectl migrate report") {
		t.Fatalf("unknown ID: %v", err)
	}
}
