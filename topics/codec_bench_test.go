package topics_test

import (
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/topics"
)

// BenchmarkDecode decodes each example record; mailbox.added is the
// projection benchmark's record.
func BenchmarkDecode(b *testing.B) {
	recs := exampleRecords(b)
	for i, typ := range domain.EventTypes() {
		r := recs[i]
		b.Run(domain.ShortType(typ), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(r.Value)))
			for b.Loop() {
				if _, err := topics.Decode(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
