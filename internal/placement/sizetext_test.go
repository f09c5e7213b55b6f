package placement

import "testing"

func TestSizeText(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0B"},
		{512, "512B"},
		{1024, "1KiB"},
		{1536, "1.5KiB (1536 B)"},
		{768 << 20, "768MiB"},
		{1234567, "1.2MiB (1234567 B)"},
		{100 << 30, "100GiB"},
		{2 << 40, "2TiB"},
		{3<<40 + 1<<30, "3073GiB"},
	} {
		if got := sizeText(c.n); got != c.want {
			t.Errorf("sizeText(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
