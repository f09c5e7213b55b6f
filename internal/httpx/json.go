package httpx

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sync"
)

// WriteJSON answers with status and v as JSON (one line). A v that does
// not encode gets a 500 internal error body instead.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	buf := bufs.Get().(*bytes.Buffer)
	defer putBuf(buf)
	buf.Reset()
	if err := json.NewEncoder(buf).Encode(v); err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"code":"internal","message":"encode answer"}}`+"\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// bufs holds encoding buffers across answers: an answer is encoded in one
// without allocating it, then copied to the connection.
var bufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func putBuf(b *bytes.Buffer) {
	if b.Cap() <= 64<<10 { // do not keep the buffer of a huge listing
		bufs.Put(b)
	}
}

var (
	// ErrBadBody is returned (wrapped) for a request body that is not one
	// JSON value of the expected shape, or that is too large.
	ErrBadBody = errors.New("httpx: bad request body")
	// ErrEmptyBody is matched by the error for an empty (or all blank)
	// body, or a bare JSON null (which would leave the value untouched: an
	// empty body under another name); it matches ErrBadBody too. Callers
	// for which no body is fine test for it (v is then left as it was).
	ErrEmptyBody = fmt.Errorf("%w: empty; a JSON value is required", ErrBadBody)
)

// emptyError is the error for an empty or null body: it says which, and
// what v needs.
type emptyError struct{ what, want string }

func (e emptyError) Error() string {
	return fmt.Sprintf("%v: %s; %s is required", ErrBadBody, e.what, e.want)
}

func (e emptyError) Is(target error) bool { return target == ErrEmptyBody || target == ErrBadBody }

// wanted says what a body decoded into v must be: a JSON object for a
// struct or a map, else a JSON value.
func wanted(v any) string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != nil && (t.Kind() == reflect.Struct || t.Kind() == reflect.Map) {
		return "a JSON object"
	}
	return "a JSON value"
}

// DecodeJSON reads r's body into v with Decode, limiting it with
// http.MaxBytesReader so that the server stops reading (and closes the
// connection) early.
func DecodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	return Decode(http.MaxBytesReader(w, r.Body, limit), limit, v)
}

// DecodeJSONTolerant is DecodeJSON except that it ignores fields v does
// not have: for requests from a peer that may be newer than this server
// (an agent takes prepare requests from a control plane that may have
// been upgraded first). Everything else is refused as DecodeJSON refuses
// it.
func DecodeJSONTolerant(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	return decode(http.MaxBytesReader(w, r.Body, limit), limit, v, false)
}

// Decode reads exactly one JSON value from rd into v, refusing bodies over
// limit bytes, unknown fields and trailing data, and empty or null bodies
// (ErrEmptyBody). Every error wraps ErrBadBody and says what is wrong
// (where the JSON breaks, which field has the wrong type, the limit).
func Decode(rd io.Reader, limit int64, v any) error { return decode(rd, limit, v, true) }

// decode is Decode; strict refuses unknown fields.
func decode(rd io.Reader, limit int64, v any, strict bool) error {
	data, err := io.ReadAll(io.LimitReader(rd, limit+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("%w: larger than %d bytes", ErrBadBody, mbe.Limit)
		}
		return fmt.Errorf("%w: %v", ErrBadBody, err)
	}
	if int64(len(data)) > limit {
		return fmt.Errorf("%w: larger than %d bytes", ErrBadBody, limit)
	}
	switch trimmed := bytes.TrimSpace(data); {
	case len(trimmed) == 0:
		return emptyError{"empty", wanted(v)}
	case string(trimmed) == "null":
		return emptyError{"null", wanted(v)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s", ErrBadBody, describe(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: trailing data after the JSON value", ErrBadBody)
	}
	return nil
}

// describe says what is wrong with a body json could not decode.
func describe(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("malformed JSON at byte %d", se.Offset)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("field %q must be %s, not %s", te.Field, te.Type, te.Value)
		}
		return fmt.Sprintf("body must be %s, not %s", te.Type, te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated JSON"
	}
	return err.Error()
}
