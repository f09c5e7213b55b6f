package redfish_test

import "testing"

// FuzzActionBodies: the Redfish bodies other than a system's (that is
// FuzzSystemRequest's): the CompositionService.Compose action (Preview,
// PreviewReserve, Apply, of a manifest or a reservation) and a session's
// login. Any body gets a JSON answer, a success or a Redfish error, never
// a 5xx.
func FuzzActionBodies(f *testing.F) {
	const block = `{"@odata.id":"/redfish/v1/CompositionService/ResourceBlocks/n1-disk0"}`
	for _, c := range []struct {
		login bool
		body  string
	}{
		{false, `{"RequestFormat":"Manifest","RequestType":"Preview","Manifest":{"Stanzas":[{"StanzaType":"ComposeSystem","StanzaId":"s1",` +
			`"Request":{"Name":"g","Links":{"ResourceBlocks":[` + block + `]}}}]}}`},
		{false, `{"RequestFormat":"Manifest","RequestType":"PreviewReserve","Manifest":{"Stanzas":[{"StanzaType":"ComposeSystem",` +
			`"Request":{"Memory":[{"CapacityMiB":8}]}}]}}`},
		{false, `{"RequestFormat":"Manifest","RequestType":"Apply","Manifest":{"Stanzas":[{"StanzaType":"ComposeSystem","StanzaId":"a",` +
			`"Request":{"Storage":[{"Drives":[{"CapacityBytes":1048576}],"@Redfish.RequestedCount":2}]}}]}}`},
		{false, `{"RequestFormat":"Manifest","RequestType":"Apply","ReservationId":"nope"}`},
		{false, `{"RequestFormat":"Manifest","RequestType":"Preview","ReservationId":"r"}`},
		{false, `{"RequestFormat":"Manifest","RequestType":"Apply","Manifest":{"Stanzas":[{"StanzaType":"DecomposeSystem"},null,{}]}}`},
		{false, `{"RequestFormat":"Other"}`}, {false, `[]`}, {false, `{"Manifest":7}`},
		{true, `{"UserName":"u","Password":"` + alice + `"}`}, {true, `{"UserName":"u","Password":""}`}, {true, `{"Password":1}`}, {true, `null`},
	} {
		f.Add(c.login, c.body)
	}
	f.Fuzz(func(t *testing.T, login bool, body string) {
		e := newEnv(t)
		path, tok := "/redfish/v1/CompositionService/Actions/CompositionService.Compose", alice
		if login {
			path, tok = "/redfish/v1/SessionService/Sessions", ""
		}
		status, out := e.postRaw(path, tok, body)
		switch {
		case status >= 500:
			t.Fatalf("%d for %q: %v", status, body, out)
		case status >= 300:
			redfishError(t, out)
		}
	})
}
