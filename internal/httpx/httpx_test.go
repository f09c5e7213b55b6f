package httpx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type body struct {
	Kind string `json:"kind"`
	Size int64  `json:"size"`
}

func TestDecode(t *testing.T) {
	for _, c := range []struct {
		in   string
		want error  // nil: decodes
		says string // in the error's text
	}{
		{`{"kind":"block","size":1}`, nil, ""},
		{` {"kind":"block"}` + "\n", nil, ""},
		{``, ErrEmptyBody, "empty; a JSON object is required"},
		{" \n\t", ErrEmptyBody, "empty"},
		{`null`, ErrEmptyBody, "null; a JSON object is required"},
		{" null\n", ErrEmptyBody, "null"},
		{`{}`, nil, ""},
		{`{"kind":"block"} {}`, ErrBadBody, "trailing data"},
		{`{"kind":"block"},`, ErrBadBody, "trailing data"},
		{`{"kind":"block","extra":1}`, ErrBadBody, `unknown field "extra"`},
		{`{"kind":"block","size":"x"}`, ErrBadBody, `field "size" must be int64, not string`},
		{`{"kind":`, ErrBadBody, "truncated JSON"},
		{`{"kind" 1}`, ErrBadBody, "malformed JSON at byte"},
		{`[]`, ErrBadBody, "body must be httpx.body, not array"},
		{`{"size":1e400}`, ErrBadBody, `field "size"`},
		{`{"kind":"` + strings.Repeat("a", 200) + `"}`, ErrBadBody, "larger than 128 bytes"},
	} {
		var v body
		err := Decode(strings.NewReader(c.in), 128, &v)
		switch {
		case c.want == nil && err != nil:
			t.Errorf("%q: %v", c.in, err)
		case c.want != nil && (!errors.Is(err, c.want) || !errors.Is(err, ErrBadBody) || !strings.Contains(err.Error(), c.says)):
			t.Errorf("%q: got %v, want %v saying %q", c.in, err, c.want, c.says)
		}
	}
	var v body
	if err := Decode(strings.NewReader(`{"kind":"block","size":7}`), 128, &v); err != nil || v != (body{"block", 7}) {
		t.Errorf("decoded %+v, %v", v, err)
	}
	// What is required follows v's type.
	var n int
	if err := Decode(strings.NewReader(""), 128, &n); !errors.Is(err, ErrEmptyBody) || !strings.Contains(err.Error(), "empty; a JSON value is required") {
		t.Errorf("empty body into an int: %v", err)
	}
	if err := Decode(strings.NewReader("null"), 128, &map[string]int{}); !strings.Contains(fmt.Sprint(err), "null; a JSON object is required") {
		t.Errorf("null body into a map: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"kind":"block","size":268435456}`, `{}`, `null`, `{"kind":1}`, `[1,2]`, `{"size":-1} x`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v body
		if err := Decode(bytes.NewReader(b), 1<<10, &v); err != nil && !errors.Is(err, ErrBadBody) {
			t.Fatalf("error does not wrap ErrBadBody: %v", err)
		}
	})
}

var (
	errGone  = errors.New("test: gone")
	errBusy  = errors.New("test: busy")
	testMap  = ErrorMap{{Err: errGone, Status: http.StatusNotFound, Code: CodeNotFound}, {Err: errBusy, Status: http.StatusConflict, Code: "busy"}}
	testBody = 64
)

// server answers /json with WriteJSON, /err/{name} with testMap, and
// /decode by decoding a body and echoing it.
func server(t *testing.T) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /json", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusCreated, body{"memory", 3})
	})
	mux.HandleFunc("GET /unencodable", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, math.Inf(1))
	})
	mux.HandleFunc("GET /err/{name}", func(w http.ResponseWriter, r *http.Request) {
		var err error
		switch r.PathValue("name") {
		case "gone":
			err = fmt.Errorf("lease 7: %w", errGone)
		case "busy":
			err = fmt.Errorf("slot 2: %w", errBusy)
		default:
			err = errors.New("disk on fire")
		}
		testMap.Write(w, err)
	})
	mux.HandleFunc("POST /decode", func(w http.ResponseWriter, r *http.Request) {
		var v body
		if err := DecodeJSON(w, r, int64(testBody), &v); err != nil {
			WriteError(w, http.StatusBadRequest, CodeInvalid, err.Error())
			return
		}
		WriteJSON(w, http.StatusOK, v)
	})
	mux.HandleFunc("POST /tolerant", func(w http.ResponseWriter, r *http.Request) {
		var v body
		if err := DecodeJSONTolerant(w, r, int64(testBody), &v); err != nil {
			WriteError(w, http.StatusBadRequest, CodeInvalid, err.Error())
			return
		}
		WriteJSON(w, http.StatusOK, v)
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func TestAnswers(t *testing.T) {
	s := server(t)
	for _, c := range []struct {
		method, path, in string
		status           int
		body             string // exact, for JSON answers
		code, says       string // for error answers
	}{
		{"GET", "/json", "", 201, `{"kind":"memory","size":3}` + "\n", "", ""},
		{"GET", "/unencodable", "", 500, "", CodeInternal, "encode answer"},
		{"GET", "/err/gone", "", 404, "", CodeNotFound, "lease 7: test: gone"},
		{"GET", "/err/busy", "", 409, "", "busy", "slot 2: test: busy"},
		{"GET", "/err/other", "", 500, "", CodeInternal, "disk on fire"},
		{"POST", "/decode", `{"kind":"block","size":9}`, 200, `{"kind":"block","size":9}` + "\n", "", ""},
		{"POST", "/decode", `{"kind":"block","sise":9}`, 400, "", CodeInvalid, `unknown field "sise"`},
		{"POST", "/decode", ``, 400, "", CodeInvalid, "empty"},
		{"POST", "/tolerant", `{"kind":"block","sise":9,"size":3}`, 200, `{"kind":"block","size":3}` + "\n", "", ""},
		{"POST", "/tolerant", `{"kind":"block"} {}`, 400, "", CodeInvalid, "trailing data"},
		{"POST", "/tolerant", `null`, 400, "", CodeInvalid, "null; a JSON object is required"},
		{"POST", "/tolerant", `{"kind":"` + strings.Repeat("b", 2*testBody) + `"}`, 400, "", CodeInvalid, "larger than 64 bytes"},
		{"POST", "/decode", `{"kind":"` + strings.Repeat("b", 2*testBody) + `"}`, 400, "", CodeInvalid, "larger than 64 bytes"},
	} {
		req, err := http.NewRequest(c.method, s.URL+c.path, strings.NewReader(c.in))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %q, want %d application/json", c.method, c.path, resp.StatusCode, resp.Header.Get("Content-Type"), c.status)
		}
		if c.code == "" {
			b, _ := io.ReadAll(resp.Body)
			if string(b) != c.body {
				t.Errorf("%s %s: body %q, want %q", c.method, c.path, b, c.body)
			}
		} else if e := ReadError(resp.Body); e.Code != c.code || !strings.Contains(e.Message, c.says) {
			t.Errorf("%s %s: error %+v, want code %s saying %q", c.method, c.path, e, c.code, c.says)
		}
		resp.Body.Close()
	}
}

func TestErrorMapLookup(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{errGone, 404, CodeNotFound},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", errBusy)), 409, "busy"},
		{errors.Join(errors.New("x"), errGone), 404, CodeNotFound},
		{errors.New("other"), 500, CodeInternal},
	} {
		if m := testMap.Lookup(c.err); m.Status != c.status || m.Code != c.code {
			t.Errorf("%v: %d %s, want %d %s", c.err, m.Status, m.Code, c.status, c.code)
		}
	}
	if m := ErrorMap(nil).Lookup(errGone); m.Status != 500 || m.Code != CodeInternal {
		t.Errorf("zero ErrorMap: %+v", m)
	}
	if testMap.Sentinel("busy") != errBusy || testMap.Sentinel(CodeNotFound) != errGone || testMap.Sentinel("nope") != nil {
		t.Error("Sentinel does not invert the map")
	}
}

func TestReadErrorOfOtherBodies(t *testing.T) {
	for _, in := range []string{"", "not json", `{"error":"flat"}`, `[1]`} {
		if e := ReadError(strings.NewReader(in)); e != (ErrorInfo{}) {
			t.Errorf("%q: %+v, want empty", in, e)
		}
	}
}
