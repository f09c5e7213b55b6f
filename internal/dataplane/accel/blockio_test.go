package accel

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
)

const partSecret = "rlc_block_part_secret"

func TestBlockIORoundTrip(t *testing.T) {
	for _, b := range []BlockIO{
		{Addr: 0, Len: 1, Range: BlockRange{Parts: []string{"nbd://10.0.0.1:10809/" + partSecret}}},
		{Addr: 1 << 40, Len: 64 << 20, Range: BlockRange{Parts: []string{"nbd://a:1/x", "nbd://b:2/y", "nbd://c:3/z"}, StripeUnit: 128 << 10, Offset: 1<<63 + 5}},
	} {
		p, err := AppendBlockIO(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseBlockIO(p)
		if err != nil || !reflect.DeepEqual(got, b) {
			t.Fatalf("round trip: %+v, %v", got.Range.Parts, err)
		}
	}
}

func TestBlockIOMalformed(t *testing.T) {
	good, err := AppendBlockIO(nil, BlockIO{Len: 4, Range: BlockRange{Parts: []string{"nbd://h:1/" + partSecret}}})
	if err != nil {
		t.Fatal(err)
	}
	header := func(k uint16) []byte {
		p := make([]byte, 24)
		return binary.LittleEndian.AppendUint16(p, k)
	}
	for _, tc := range []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"short header", good[:10]},
		{"truncated part", good[:len(good)-3]},
		{"trailing bytes", append(append([]byte(nil), good...), 0)},
		{"no parts", header(0)},
		{"too many parts", header(MaxBlockParts + 1)},
		{"empty part", append(header(1), 0, 0)},
	} {
		_, err := ParseBlockIO(tc.p)
		if !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", tc.name, err)
		}
		if err != nil && strings.Contains(err.Error(), partSecret) {
			t.Errorf("%s: error quotes the credential", tc.name)
		}
	}
	for _, r := range []BlockRange{{}, {Parts: make([]string, MaxBlockParts+1)}, {Parts: []string{""}}} {
		if _, err := AppendBlockIO(nil, BlockIO{Range: r}); !errors.Is(err, ErrFrame) {
			t.Errorf("encoding %d parts: %v", len(r.Parts), err)
		}
	}
}

// A BlockRange printed, logged or formatted any way shows hosts, never
// export names.
func TestBlockRangeRedacted(t *testing.T) {
	r := BlockRange{Parts: []string{"nbd://10.0.0.1:10809/" + partSecret, "nbd+unix:///" + partSecret + "?socket=/s", "::bad"}, Offset: 7}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "range", r)
	for _, s := range []string{r.Redacted(), r.String(), fmt.Sprintf("%v %+v %#v %s", r, r, r, r), logs.String()} {
		if strings.Contains(s, partSecret) {
			t.Fatalf("credential shown: %s", s)
		}
	}
	if want := "@7 on 3 part(s) (10.0.0.1:10809, ?, ?)"; r.Redacted() != want {
		t.Errorf("Redacted %q, want %q", r.Redacted(), want)
	}
}

// A target without slot memory (a gateway) refuses LOAD and STORE with
// Unsupported; the connection goes on.
func TestBlockIOUnsupported(t *testing.T) {
	tgt := &memTarget{mem: make([]byte, 4096), release: make(chan struct{})}
	c := dial(t, startServer(t, tgt, 8))
	ctx := context.Background()
	r := BlockRange{Parts: []string{"nbd://127.0.0.1:1/" + partSecret}}
	if err := c.Load(ctx, 0, 16, r); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("load: %v", err)
	}
	if err := c.Store(ctx, 0, 16, r); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("store: %v", err)
	}
	if _, _, err := c.RunBlockTask(ctx, BlockTask{Entry: "echo", Input: r, InLen: 16}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("block task: %v", err)
	}
	if _, _, err := c.RunBlockTask(ctx, BlockTask{Entry: "echo", Input: r, InLen: 8192}); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("block task larger than the slot: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseBlockIO(f *testing.F) {
	for _, b := range []BlockIO{
		{Len: 4096, Range: BlockRange{Parts: []string{"nbd://10.0.0.1:10809/rlc_x"}}},
		{Addr: 8, Len: 1, Range: BlockRange{Parts: []string{"nbd://a:1/x", "nbd://b:2/y"}, StripeUnit: 65536, Offset: 3}},
	} {
		p, _ := AppendBlockIO(nil, b)
		f.Add(p)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := ParseBlockIO(p)
		if err != nil {
			return
		}
		re, err := AppendBlockIO(nil, b)
		if err != nil || !bytes.Equal(re, p) {
			t.Fatalf("re-encoding differs (%v)", err)
		}
	})
}
