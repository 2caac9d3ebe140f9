package ms2m

import "testing"

// TestSequenceDigest: the digest of 1..N is what applying each of those
// messages once gives, and a lost or repeated message changes it.
func TestSequenceDigest(t *testing.T) {
	var once, lost, twice Totals
	for seq := uint64(1); seq <= 50; seq++ {
		once.Add(Message{Seq: seq})
		twice.Add(Message{Seq: seq})
		if seq != 17 {
			lost.Add(Message{Seq: seq})
		}
	}
	twice.Add(Message{Seq: 17})
	if once.Digest != SequenceDigest(50) {
		t.Fatalf("digest of 1..50 applied once %s, SequenceDigest %s", once.Digest, SequenceDigest(50))
	}
	if lost.Digest == SequenceDigest(50) || twice.Digest == SequenceDigest(50) {
		t.Fatal("a lost or repeated message leaves the digest unchanged")
	}
}
