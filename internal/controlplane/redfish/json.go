package redfish

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
)

// obj is a Redfish resource or object as JSON.
type obj = map[string]any

func link(path string) obj { return obj{"@odata.id": path} }

func links(paths []string) []obj {
	out := make([]obj, 0, len(paths))
	for _, p := range paths {
		out = append(out, link(p))
	}
	return out
}

// collection is a resource collection of the given schema.
func collection(path, typ, name string, members []string) obj {
	return obj{
		"@odata.id":           path,
		"@odata.type":         "#" + typ + "." + typ,
		"Name":                name,
		"Members":             links(members),
		"Members@odata.count": len(members),
	}
}

// etag is a weak entity tag of a resource's JSON.
func etag(b []byte) string {
	h := sha256.Sum256(b)
	return `W/"` + hex.EncodeToString(h[:8]) + `"`
}

// writeJSON answers v with Redfish's headers. A resource (r non-nil,
// status 200) gets an ETag, and a GET whose If-None-Match matches it gets
// 304. allow, if not empty, is the Allow header.
func writeJSON(w http.ResponseWriter, r *http.Request, status int, v any, allow string) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error":{"code":"Base.1.18.InternalError","message":"encode answer"}}`, http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("OData-Version", "4.0")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	if allow != "" {
		h.Set("Allow", allow)
	}
	if r != nil && status == http.StatusOK {
		tag := etag(b)
		h.Set("ETag", tag)
		if inm := r.Header.Get("If-None-Match"); inm != "" && matchETag(inm, tag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	h.Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	if r != nil && r.Method == http.MethodHead {
		return
	}
	var buf bytes.Buffer
	buf.Write(b)
	buf.WriteByte('\n')
	w.Write(buf.Bytes())
}

// matchETag reports whether an If-Match/If-None-Match list names tag
// (weakly compared) or is "*".
func matchETag(list, tag string) bool {
	weak := strings.TrimPrefix(tag, "W/")
	for _, t := range strings.Split(list, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || strings.TrimPrefix(t, "W/") == weak {
			return true
		}
	}
	return false
}
