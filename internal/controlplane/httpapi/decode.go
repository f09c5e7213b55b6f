package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// ErrBadBody is returned (wrapped) for a body that is not one strict JSON
// value of the expected shape, or that is too large.
var ErrBadBody = errors.New("httpapi: bad request body")

// MaxBody is the default request-body limit.
const MaxBody = 1 << 20

// Decode reads exactly one JSON value from r into v, refusing unknown
// fields, trailing data and bodies over limit bytes. An empty body, or a
// bare JSON null, is an error unless allowEmpty (then v is left as is).
func Decode(r io.Reader, limit int64, allowEmpty bool, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
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
		if allowEmpty {
			return nil
		}
		return fmt.Errorf("%w: empty; a JSON object is required", ErrBadBody)
	case string(trimmed) == "null":
		// Decoding null into a struct leaves it untouched: it is an empty
		// body under another name, and must not pass for a value.
		if allowEmpty {
			return nil
		}
		return fmt.Errorf("%w: null; a JSON object is required", ErrBadBody)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrBadBody, describe(err))
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after the JSON value", ErrBadBody)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: trailing data after the JSON value", ErrBadBody)
	}
	return nil
}

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

// DecodeRequest decodes r's body into v with Decode, limiting it with
// http.MaxBytesReader so that the server stops reading early.
func DecodeRequest(w http.ResponseWriter, r *http.Request, limit int64, allowEmpty bool, v any) error {
	body := http.MaxBytesReader(w, r.Body, limit)
	return Decode(body, limit, allowEmpty, v)
}

// WriteJSON answers with status and v as JSON (one line).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	buf := bufs.Get().(*bytes.Buffer)
	defer putBuf(buf)
	buf.Reset()
	if err := json.NewEncoder(buf).Encode(v); err != nil {
		http.Error(w, `{"error":{"code":"internal","message":"encode answer"}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// bufs holds encoding buffers across answers: an answer is encoded in one
// without allocating it, then copied to the connection.
var bufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func putBuf(b *bytes.Buffer) {
	if b.Cap() <= 64<<10 { // do not keep the buffer of a huge listing
		bufs.Put(b)
	}
}
