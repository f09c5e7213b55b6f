package svgtext

import "testing"

func TestWidth(t *testing.T) {
	for _, c := range []struct {
		s    string
		size float64
		want float64
	}{
		{"", 12, 0},
		{"i", 10, 3},
		{"W", 10, 9},
		{"A", 10, 7},
		{"a", 10, 5.8},
		{"r", 10, 4},
		{"MB/s", 10, 9 + 7 + 4 + 5.8},
	} {
		if got := Width(c.s, c.size); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("Width(%q, %v) = %v, want %v", c.s, c.size, got, c.want)
		}
	}
	if Width("WWWW", 12) <= Width("iiii", 12) {
		t.Error("wide letters estimated narrower than thin ones")
	}
}

func TestColor(t *testing.T) {
	if Color(0) != Palette[0] || Color(len(Palette)) != Palette[0] || Color(1) == Color(0) {
		t.Error("Color does not cycle through Palette")
	}
}
