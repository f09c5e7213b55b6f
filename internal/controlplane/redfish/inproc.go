package redfish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// inproc is an http.RoundTripper that serves requests with a handler in
// this process: the facade reaches the /v1 API without a socket, so it is
// held to the same authentication, tenant rules and validation as any
// client. Answers stream (the event stream works through it).
type inproc struct{ h http.Handler }

func (t inproc) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	sreq := req.Clone(ctx)
	sreq.RequestURI = req.URL.RequestURI()
	sreq.RemoteAddr = "127.0.0.1:0" // the facade itself
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if v := recover(); v != nil { // as net/http would: the request fails, the process lives
				w.sendHeader(http.StatusInternalServerError)
				pw.CloseWithError(fmt.Errorf("redfish: handler panicked: %v", v))
				return
			}
			w.sendHeader(http.StatusOK)
			pw.Close()
		}()
		t.h.ServeHTTP(w, sreq)
	}()
	select {
	case <-w.ready:
	case <-ctx.Done():
		pr.Close()
		cancel()
		<-done
		return nil, ctx.Err()
	}
	return &http.Response{
		Status: http.StatusText(w.status), StatusCode: w.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: &pipeBody{pr: pr, cancel: cancel, done: done}, ContentLength: -1, Request: req,
	}, nil
}

// pipeWriter is the handler's side: headers go out with the first write
// or flush, the body through the pipe.
type pipeWriter struct {
	header http.Header
	pw     *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
	status int
	sent   http.Header
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) sendHeader(code int) {
	w.once.Do(func() {
		w.status = code
		w.sent = w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) WriteHeader(code int) { w.sendHeader(code) }

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.sendHeader(http.StatusOK)
	return w.pw.Write(b)
}

// Flush sends the headers; the pipe holds no data.
func (w *pipeWriter) Flush() { w.sendHeader(http.StatusOK) }

// pipeBody is the client's side; Close ends the handler and waits for it.
type pipeBody struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
}

func (b *pipeBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

func (b *pipeBody) Close() error {
	b.pr.CloseWithError(errors.New("redfish: answer closed"))
	b.cancel()
	<-b.done
	return nil
}
