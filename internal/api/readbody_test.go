package api

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestReadAll: the body is read whole whatever its declared length says
// (exact, unknown, too short, too long) and however the reader splits it;
// a read error is returned with what was read.
func TestReadAll(t *testing.T) {
	t.Parallel()
	body := bytes.Repeat([]byte(`{"id":"x"},`), 1500) // 16,500 bytes
	for _, tc := range []struct {
		name string
		size int64
	}{{"exact", int64(len(body))}, {"unknown", -1}, {"declared short", 100}, {"declared long", int64(len(body)) * 2}, {"zero", 0}} {
		for rn, r := range map[string]func() io.Reader{
			"whole":    func() io.Reader { return bytes.NewReader(body) },
			"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(body)) },
			"halves":   func() io.Reader { return iotest.HalfReader(bytes.NewReader(body)) },
		} {
			got, err := readAll(r(), tc.size)
			if err != nil || !bytes.Equal(got, body) {
				t.Errorf("%s, %s: %d bytes, err %v; want the %d bytes of the body", tc.name, rn, len(got), err, len(body))
			}
		}
	}
	if got, err := readAll(bytes.NewReader(nil), 0); err != nil || len(got) != 0 {
		t.Errorf("empty body: %q, %v", got, err)
	}
	boom := errors.New("connection reset")
	got, err := readAll(io.MultiReader(bytes.NewReader(body[:700]), iotest.ErrReader(boom)), int64(len(body)))
	if !errors.Is(err, boom) || !bytes.Equal(got, body[:700]) {
		t.Errorf("interrupted body: %d bytes, err %v; want the 700 read and the error", len(got), err)
	}
}
