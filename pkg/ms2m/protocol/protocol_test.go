package protocol

import (
	"encoding/json"
	"testing"
)

// TestSequenceDigest: the digest of 1..N is what applying each of those
// messages once gives, and a lost or repeated message changes it.
func TestSequenceDigest(t *testing.T) {
	for _, producer := range []string{"", "run-1"} {
		var once, lost, twice Totals
		for seq := uint64(1); seq <= 50; seq++ {
			once.Add(Position{Producer: producer, Seq: seq})
			twice.Add(Position{Producer: producer, Seq: seq})
			if seq != 17 {
				lost.Add(Position{Producer: producer, Seq: seq})
			}
		}
		twice.Add(Position{Producer: producer, Seq: 17})
		want := SequenceDigest(producer, 50)
		if once.Digest != want {
			t.Fatalf("producer %q: digest of 1..50 applied once %s, SequenceDigest %s", producer, once.Digest, want)
		}
		if lost.Digest == want || twice.Digest == want {
			t.Fatalf("producer %q: a lost or repeated message leaves the digest unchanged", producer)
		}
	}
	if SequenceDigest("run-1", 50) == SequenceDigest("run-2", 50) {
		t.Fatal("two producer runs' sequences hash alike: a restarted run's messages would look applied")
	}
}

// TestTotalsPlus: the totals of two producer runs, as each reported them
// over the wire, add up to what a consumer that applied both reports.
func TestTotalsPlus(t *testing.T) {
	var first, second, both Totals
	for seq := uint64(1); seq <= 30; seq++ {
		a, b := Position{Producer: "a", Seq: seq}, Position{Producer: "b", Seq: seq}
		first.Add(a)
		both.Add(a)
		if seq <= 20 {
			second.Add(b)
			both.Add(b)
		}
	}
	var wire [2]Totals
	for i, tot := range []Totals{first, second} {
		raw, _ := json.Marshal(tot)
		if err := json.Unmarshal(raw, &wire[i]); err != nil {
			t.Fatal(err)
		}
	}
	got := wire[0].Plus(wire[1])
	if !got.Equal(both) || got.Digest != both.Digest {
		t.Fatalf("sum of the runs' totals %+v, both applied %+v", got, both)
	}
	if var0 := (Totals{}).Plus(first); var0.Digest != first.Digest {
		t.Fatalf("nothing plus a set is %s, want %s", var0.Digest, first.Digest)
	}
}

// TestReachedAndDuplicates: a position of the current run is reached by
// sequence, one of a retired run always, one of a run not seen yet never;
// only messages of the current run up to its last sequence, or of a retired
// run, are duplicates.
func TestReachedAndDuplicates(t *testing.T) {
	st := State{Producer: "b", LastSeq: 5, RetiredProducers: []string{"a"}}
	for _, c := range []struct {
		p    Position
		want bool
	}{
		{Position{Producer: "b", Seq: 5}, true},
		{Position{Producer: "b", Seq: 6}, false},
		{Position{Producer: "a", Seq: 900}, true},
		{Position{Producer: "c", Seq: 1}, false},
		{Position{}, true},
	} {
		if got := st.Reached(c.p); got != c.want {
			t.Errorf("Reached(%s) = %v, want %v", c.p, got, c.want)
		}
	}
}
