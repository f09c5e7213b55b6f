package httpx_test

import (
	"encoding/json"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/httpx"
)

// TestSameAsAPI keeps httpx's error body and codes those of the API (the
// data planes answer in the API's shape without importing api).
func TestSameAsAPI(t *testing.T) {
	for _, c := range [][2]string{
		{httpx.CodeInvalid, api.CodeInvalid},
		{httpx.CodeUnauthorized, api.CodeUnauthorized},
		{httpx.CodeForbidden, api.CodeForbidden},
		{httpx.CodeNotFound, api.CodeNotFound},
		{httpx.CodeConflict, api.CodeConflict},
		{httpx.CodeInfeasible, api.CodeInfeasible},
		{httpx.CodeQuota, api.CodeQuota},
		{httpx.CodeUnavailable, api.CodeUnavailable},
		{httpx.CodeInternal, api.CodeInternal},
	} {
		if c[0] != c[1] {
			t.Errorf("httpx code %q, api code %q", c[0], c[1])
		}
		x, err := json.Marshal(httpx.ErrorBody{Error: httpx.ErrorInfo{Code: c[0], Message: "m <&> \"q\""}})
		if err != nil {
			t.Fatal(err)
		}
		a, err := json.Marshal(api.ErrorBody{Error: api.ErrorInfo{Code: c[1], Message: "m <&> \"q\""}})
		if err != nil {
			t.Fatal(err)
		}
		if string(x) != string(a) {
			t.Errorf("httpx body %s, api body %s", x, a)
		}
		var back api.ErrorBody
		if err := json.Unmarshal(x, &back); err != nil || back.Error.Code != c[1] {
			t.Errorf("api cannot read httpx's body %s: %+v %v", x, back, err)
		}
	}
}
