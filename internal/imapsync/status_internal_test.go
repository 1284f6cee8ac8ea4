package imapsync

import (
	"testing"

	"github.com/emersion/go-imap/v2"
)

// A STATUS answer passes over a folder only when it shows every item equal
// to the last sync's; an item the server leaves out (or a zero UIDNEXT)
// counts as a change, so a terse or hostile server costs a SELECT, never a
// missed message.
func TestFolderStateUnchangedBy(t *testing.T) {
	t.Parallel()
	n := func(v uint32) *uint32 { return &v }
	was := folderState{uidValidity: 7, uidNext: 12, messages: 3, modseq: 40}
	for _, tc := range []struct {
		name      string
		st        imap.StatusData
		condstore bool
		want      bool
	}{
		{"all equal", imap.StatusData{UIDValidity: 7, UIDNext: 12, NumMessages: n(3), HighestModSeq: 40}, true, true},
		{"new message", imap.StatusData{UIDValidity: 7, UIDNext: 13, NumMessages: n(4), HighestModSeq: 41}, true, false},
		{"expunged", imap.StatusData{UIDValidity: 7, UIDNext: 12, NumMessages: n(2), HighestModSeq: 41}, true, false},
		{"flags changed (CONDSTORE)", imap.StatusData{UIDValidity: 7, UIDNext: 12, NumMessages: n(3), HighestModSeq: 41}, true, false},
		{"no CONDSTORE: modseq not compared", imap.StatusData{UIDValidity: 7, UIDNext: 12, NumMessages: n(3)}, false, true},
		{"UIDVALIDITY changed", imap.StatusData{UIDValidity: 8, UIDNext: 12, NumMessages: n(3), HighestModSeq: 40}, true, false},
		{"MESSAGES left out", imap.StatusData{UIDValidity: 7, UIDNext: 12, HighestModSeq: 40}, true, false},
		{"UIDNEXT left out", imap.StatusData{UIDValidity: 7, NumMessages: n(3), HighestModSeq: 40}, true, false},
	} {
		if got := was.unchangedBy(&tc.st, tc.condstore); got != tc.want {
			t.Errorf("%s: unchanged %v, want %v", tc.name, got, tc.want)
		}
	}
	// A folder whose last sync saw no UIDNEXT is never passed over.
	if (folderState{uidValidity: 7, messages: 3}).unchangedBy(&imap.StatusData{UIDValidity: 7, NumMessages: n(3)}, false) {
		t.Error("a zero UIDNEXT passed as unchanged")
	}
}
