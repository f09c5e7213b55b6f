package nbd

import (
	"strings"
	"testing"
)

func TestParseURIErrorHidesExport(t *testing.T) {
	const secret = "rlc_supersecretexportname"
	for _, s := range []string{"nbd://127.0.0.1:10809/" + secret + "%zz", "nbd://[::1/" + secret} {
		_, err := ParseURI(s)
		if err == nil {
			t.Fatalf("ParseURI(%q) succeeded", s)
		}
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("error leaks the export name: %v", err)
		}
	}
}
