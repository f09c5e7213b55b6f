package httpapi

import (
	"encoding/json"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Route describes one API route for the OpenAPI document.
type Route struct {
	Method   string
	Path     string // ServeMux pattern path, e.g. /v1/leases/{id}
	Summary  string
	Auth     string // who may call it; "" means no token
	Request  any    // zero value of the body type, or nil
	Response any    // zero value of the answer type, a Content, a content type (string: a text answer), or nil
	Query    []Param
	Status   int   // success status (default 200)
	Also     []int // other success statuses with the same answer (e.g. 200 for an idempotent replay of a 201)
	Errors   []int // error statuses the route may answer (JSON error bodies; text for a text answer)
	// Streams lists other content types the success answer may take (as
	// text), e.g. text/event-stream for a route that can stream.
	Streams []string
}

// Content is an answer given by content type and JSON schema, for answers
// that are not one of the api types (e.g. the OpenAPI document itself).
type Content struct {
	Type   string
	Schema map[string]any
}

// Param is a query parameter.
type Param struct {
	Name, Type, Description string
}

type gen struct {
	schemas map[string]any
}

var timeType = reflect.TypeOf(time.Time{})

func (g *gen) schema(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t.Kind() == reflect.Pointer:
		return g.schema(t.Elem())
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return map[string]any{"type": "integer"}
	case reflect.Int64, reflect.Uint64:
		return map[string]any{"type": "integer", "format": "int64"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": g.schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem())}
	case reflect.Struct:
		name := t.Name()
		if _, ok := g.schemas[name]; !ok && name != "" {
			g.schemas[name] = nil // break cycles
			g.schemas[name] = g.object(t)
		}
		if name == "" {
			return g.object(t)
		}
		return map[string]any{"$ref": "#/components/schemas/" + name}
	}
	return map[string]any{}
}

func (g *gen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	var required []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		props[name] = g.schema(f.Type)
		if !strings.Contains(opts, "omitempty") {
			required = append(required, name)
		}
	}
	o := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		sort.Strings(required)
		o["required"] = required
	}
	return o
}

// OpenAPI returns an OpenAPI 3.0 document describing routes, with error
// answers in the shape of errBody.
func OpenAPI(title, version string, routes []Route, errBody any) ([]byte, error) {
	g := &gen{schemas: map[string]any{}}
	errRef := g.schema(reflect.TypeOf(errBody))
	paths := map[string]map[string]any{}
	for _, r := range routes {
		op := map[string]any{
			"summary":     r.Summary,
			"operationId": opID(r),
		}
		if r.Auth != "" {
			op["security"] = []any{map[string]any{"bearer": []string{}}}
			op["description"] = "Requires: " + r.Auth + "."
		} else {
			op["security"] = []any{}
		}
		var params []any
		for _, seg := range strings.Split(r.Path, "/") {
			if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
				params = append(params, map[string]any{"name": strings.Trim(seg, "{}"), "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
			}
		}
		for _, q := range r.Query {
			params = append(params, map[string]any{"name": q.Name, "in": "query", "description": q.Description, "schema": map[string]any{"type": q.Type}})
		}
		if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/leases") {
			params = append(params, map[string]any{"name": "Idempotency-Key", "in": "header", "description": "retries with the same key and body return the same lease",
				"schema": map[string]any{"type": "string"}})
		}
		if params != nil {
			op["parameters"] = params
		}
		if r.Request != nil {
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(r.Request))}}}
		}
		status := r.Status
		if status == 0 {
			status = http.StatusOK
		}
		resps := map[string]any{}
		textual := false // a text answer: errors are text too
		var content map[string]any
		if r.Response != nil {
			ct := "application/json"
			var sch map[string]any
			switch v := r.Response.(type) {
			case string:
				ct, sch, textual = v, map[string]any{"type": "string"}, true
			case Content:
				ct, sch = v.Type, v.Schema
			default:
				sch = g.schema(reflect.TypeOf(r.Response))
			}
			content = map[string]any{ct: map[string]any{"schema": sch}}
			for _, st := range r.Streams {
				content[st] = map[string]any{"schema": map[string]any{"type": "string"}}
			}
		}
		for _, st := range append([]int{status}, r.Also...) {
			ok := map[string]any{"description": http.StatusText(st)}
			if content != nil {
				ok["content"] = content
			}
			resps[itoa(st)] = ok
		}
		for _, e := range r.Errors {
			errContent := map[string]any{"application/json": map[string]any{"schema": errRef}}
			if textual {
				errContent = map[string]any{"text/plain": map[string]any{"schema": map[string]any{"type": "string"}}}
			}
			resps[itoa(e)] = map[string]any{"description": http.StatusText(e), "content": errContent}
		}
		op["responses"] = resps
		if paths[r.Path] == nil {
			paths[r.Path] = map[string]any{}
		}
		paths[r.Path][strings.ToLower(r.Method)] = op
	}
	doc := map[string]any{
		"openapi": "3.0.3",
		"info":    map[string]any{"title": title, "version": version},
		"paths":   paths,
		"components": map[string]any{
			"schemas":         g.schemas,
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
		},
	}
	return json.MarshalIndent(doc, "", "  ")
}

func opID(r Route) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(r.Method))
	for _, seg := range strings.Split(r.Path, "/") {
		seg = strings.Trim(seg, "{}")
		seg = strings.NewReplacer(".", "_", "-", "_").Replace(seg)
		if seg == "" || seg == "v1" {
			continue
		}
		b.WriteString(strings.ToUpper(seg[:1]) + seg[1:])
	}
	return b.String()
}

func itoa(n int) string { return strconv.Itoa(n) }
