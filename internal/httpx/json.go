package httpx

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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
	// ErrEmptyBody is returned for an empty (or all blank) body; it
	// matches ErrBadBody too. Callers for which no body is fine test for
	// it.
	ErrEmptyBody = fmt.Errorf("%w: empty; a JSON value is required", ErrBadBody)
)

// DecodeJSON reads r's body into v with Decode, limiting it with
// http.MaxBytesReader so that the server stops reading (and closes the
// connection) early.
func DecodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	return Decode(http.MaxBytesReader(w, r.Body, limit), limit, v)
}

// Decode reads exactly one JSON value from rd into v, refusing bodies over
// limit bytes, unknown fields and trailing data. Every error wraps
// ErrBadBody and says what is wrong (where the JSON breaks, which field
// has the wrong type, the limit).
func Decode(rd io.Reader, limit int64, v any) error {
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
	if len(bytes.TrimSpace(data)) == 0 {
		return ErrEmptyBody
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
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
