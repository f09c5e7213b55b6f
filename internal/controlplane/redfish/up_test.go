package redfish_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/uptest"
)

func TestMain(m *testing.M) { uptest.Main(m) }

// pythonTool finds a tool of the Python venv .ci/run makes
// ($RIALTO_PY_VENV, default /opt/rialto-py), or on PATH.
func pythonTool(t *testing.T, name string) string {
	t.Helper()
	venv := os.Getenv("RIALTO_PY_VENV")
	if venv == "" {
		venv = "/opt/rialto-py"
	}
	if p := filepath.Join(venv, "bin", name); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	t.Skipf("%s is not installed (.ci/run installs it into %s)", name, venv)
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// sushyPython is a python with sushy importable.
func sushyPython(t *testing.T) string {
	t.Helper()
	py := pythonTool(t, "python3")
	if err := exec.Command(py, "-c", "import sushy").Run(); err != nil {
		t.Skipf("sushy is not importable by %s (.ci/run installs it): %v", py, err)
	}
	return py
}

// composeUp POSTs a system to a rialto up's Redfish service.
func composeUp(t *testing.T, up *uptest.Up, body string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("POST", up.Addr+"/redfish/v1/Systems", strings.NewReader(body))
	req.SetBasicAuth("admin", up.Token)
	resp, err := up.HTTPClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != 201 {
		t.Fatalf("compose %s: %d %v", body, resp.StatusCode, out)
	}
	return out
}

// The DMTF Redfish Service Validator, offline against DMTF's CSDL, finds
// no error in `rialto up`'s Redfish service, with composed systems of
// each kind present, logged in with a session.
func TestValidatorAgainstUp(t *testing.T) {
	if testing.Short() {
		t.Skip("runs rialto up and the validator")
	}
	csdl := csdlDir(t)
	validator := pythonTool(t, "rf_service_validator")
	up := uptest.StartUp(t, uptest.Binary(t), filepath.Join(t.TempDir(), "state"))
	composeUp(t, up, `{"Name":"striped","Storage":[{"Drives":[{"CapacityBytes":16777216}],"@Redfish.RequestedCount":3}]}`)
	composeUp(t, up, `{"Name":"mem","Memory":[{"CapacityMiB":8}]}`)
	composeUp(t, up, `{"Name":"fpga","Processors":[{"ProcessorType":"Accelerator","Model":"echo"}]}`)
	// Session auth (Basic auth is covered by TestAuth; each validator run
	// takes ten seconds or more).
	for _, auth := range []string{"Session"} {
		t.Run(auth, func(t *testing.T) {
			dir := t.TempDir()
			// Credentials go in a config file, not on the command line.
			cfg := filepath.Join(dir, "config.ini")
			ini := "[Authentication]\nuser = admin\npassword = " + up.Token + "\nauthtype = " + auth + "\n[Connection]\nrhost = " + up.Addr + "\n"
			if err := os.WriteFile(cfg, []byte(ini), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, validator, "--config", cfg, "--schema_directory", csdl, "--logdir", filepath.Join(dir, "logs"))
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			// The summary table: | PASS | WARN | FAIL | NOT TESTED | and
			// its row of counts.
			m := regexp.MustCompile(`\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|`).FindSubmatch(out)
			if m == nil {
				t.Fatalf("validator (%v) printed no summary:\n%s", err, out)
			}
			pass, _ := strconv.Atoi(string(m[1]))
			fail, _ := strconv.Atoi(string(m[3]))
			t.Logf("validator: %s pass, %s warn, %s fail, %s not tested", m[1], m[2], m[3], m[4])
			if fail != 0 || err != nil || pass < 500 {
				t.Fatalf("validator: %d failures, %d passes (%v):\n%s", fail, pass, err, out)
			}
			for _, must := range []string{"/redfish/v1/CompositionService/ResourceBlocks/", "/redfish/v1/CompositionService/ResourceZones/block", "/Storage/1/Volumes/1", "/redfish/v1/Chassis/"} {
				if !bytes.Contains(out, []byte(must)) {
					t.Errorf("validator did not visit %s", must)
				}
			}
		})
	}
}

// redfishtool composes a system from a resource block (specific
// composition), nbdinfo reads its volume through the URI the volume
// carries, and redfishtool decomposes it: the lease is released.
func TestRedfishtoolComposeDecompose(t *testing.T) {
	if testing.Short() {
		t.Skip("runs rialto up")
	}
	rft := pythonTool(t, "redfishtool")
	nbdinfo, err := exec.LookPath("nbdinfo")
	if err != nil {
		t.Skip("nbdinfo is not installed")
	}
	up := uptest.StartUp(t, uptest.Binary(t), filepath.Join(t.TempDir(), "state"))
	c := up.Client(t)
	devs, err := c.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var blockID string
	for _, d := range devs {
		if d.Kind == api.KindBlock && d.Allocated == 0 {
			blockID = d.ID
			break
		}
	}
	cfg := filepath.Join(t.TempDir(), "rft.json")
	b, _ := json.Marshal(map[string]string{"user": "admin", "password": up.Token})
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(up.Addr, "https://")
	run := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, rft, append([]string{"-r", host, "-S", "Always", "-c", cfg}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redfishtool %v: %v\n%s", args, err, out)
		}
		return out
	}
	body := `{"Name":"rft","Links":{"ResourceBlocks":[{"@odata.id":"/redfish/v1/CompositionService/ResourceBlocks/` + blockID + `"}]}}`
	var sys map[string]any
	if out := run("raw", "POST", "/redfish/v1/Systems", "-d", body); json.Unmarshal(out, &sys) != nil || sys["SystemType"] != "Composed" {
		t.Fatalf("compose: %s", out)
	}
	path := sys["@odata.id"].(string)
	var vol map[string]any
	out := run("raw", "GET", path+"/Storage/1/Volumes/1")
	if err := json.Unmarshal(out, &vol); err != nil {
		t.Fatalf("volume: %v\n%s", err, out)
	}
	uri, _ := vol["Oem"].(map[string]any)["Rialto"].(map[string]any)["URI"].(string)
	size, err := exec.Command(nbdinfo, "--size", up.LibnbdURI(uri)).Output()
	if err != nil || strings.TrimSpace(string(size)) != strconv.FormatInt(int64(vol["CapacityBytes"].(float64)), 10) {
		t.Fatalf("nbdinfo --size on the volume: %v %q, volume %v", err, size, vol)
	}
	run("raw", "DELETE", path)
	l, err := c.Lease(context.Background(), sys["Id"].(string))
	if err != nil || l.State != api.LeaseReleased {
		t.Fatalf("lease after redfishtool DELETE: %s %v", l.State, err)
	}
	if err := exec.Command(nbdinfo, "--size", up.LibnbdURI(uri)).Run(); err == nil {
		t.Error("the released volume's URI still serves")
	}
}

// sushyScript composes (argv: base compose BODY) or decomposes (argv:
// base decompose PATH) with sushy, logged in with a session; the token
// comes in the environment. Composing prints the system and its volume.
const sushyScript = `
import json, os, sys
import sushy
from sushy.resources.compositionservice import resourceblock, resourcezone
base, op, arg = sys.argv[1:4]
tok = os.environ["RIALTO_TOKEN"]
root = sushy.Sushy(base + "/redfish/v1", auth=sushy.auth.SessionAuth(username="ops", password=tok))
if op == "compose":
    cs = root.get_composition_service()
    # sushy 5.14's CompositionService.resource_blocks passes the path
    # method itself, not its result: build the collections from the paths.
    blocks = resourceblock.ResourceBlockCollection(root._conn, cs._get_resource_blocks_collection_path(), redfish_version=cs.redfish_version, root=root).get_members()
    zones = resourcezone.ResourceZoneCollection(root._conn, cs._get_resource_zones_collection_path(), redfish_version=cs.redfish_version, root=root).get_members()
    r = root._conn.post("/redfish/v1/Systems", data=json.loads(arg))
    path = r.headers["Location"]
    system = root.get_system(path)
    vol = root._conn.get(path + "/Storage/1/Volumes/1").json()
    print(json.dumps({"path": path, "type": str(system.system_type), "name": system.name,
        "blocks": len(blocks), "zones": sorted(z.identity for z in zones),
        "states": sorted(set(str(b.composition_status.composition_state) for b in blocks)), "volume": vol}))
else:
    root._conn.delete(arg)
    print(json.dumps({"deleted": arg}))
`

// sushy sees the resource blocks and zones, composes a system by
// capacity (constrained composition) and decomposes it; nbdinfo reads the
// volume in between.
func TestSushyComposeDecompose(t *testing.T) {
	if testing.Short() {
		t.Skip("runs rialto up")
	}
	py := sushyPython(t)
	nbdinfo, err := exec.LookPath("nbdinfo")
	if err != nil {
		t.Skip("nbdinfo is not installed")
	}
	up := uptest.StartUp(t, uptest.Binary(t), filepath.Join(t.TempDir(), "state"))
	script := filepath.Join(t.TempDir(), "sushy_compose.py")
	if err := os.WriteFile(script, []byte(sushyScript), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) map[string]any {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, py, append([]string{script, up.Addr}, args...)...)
		// requests (under sushy) verifies the API against the cluster CA.
		cmd.Env = append(os.Environ(), "RIALTO_TOKEN="+up.Token, "REQUESTS_CA_BUNDLE="+up.CACert)
		out, err := cmd.Output()
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		var res map[string]any
		if err != nil || json.Unmarshal(out, &res) != nil {
			t.Fatalf("sushy %v: %v\n%s%s", args, err, out, stderr)
		}
		return res
	}
	res := run("compose", `{"Name":"sushy","Storage":[{"Drives":[{"CapacityBytes":33554432}]}]}`)
	// 3 nodes × (2 disks, a memory device, an accelerator).
	if res["type"] != "SystemType.COMPOSED" || res["name"] != "sushy" || res["blocks"] != float64(12) ||
		strings.Join(toStrings(res["zones"]), ",") != "accel,block,memory" {
		t.Fatalf("sushy saw %v", res)
	}
	vol := res["volume"].(map[string]any)
	uri := vol["Oem"].(map[string]any)["Rialto"].(map[string]any)["URI"].(string)
	if size, err := exec.Command(nbdinfo, "--size", up.LibnbdURI(uri)).Output(); err != nil || strings.TrimSpace(string(size)) != "33554432" {
		t.Fatalf("nbdinfo --size: %v %q", err, size)
	}
	run("decompose", res["path"].(string))
	id := strings.TrimPrefix(res["path"].(string), "/redfish/v1/Systems/")
	if l, err := up.Client(t).Lease(context.Background(), id); err != nil || l.State != api.LeaseReleased {
		t.Fatalf("lease after sushy's delete: %s %v", l.State, err)
	}
}

func toStrings(x any) []string {
	var out []string
	for _, v := range x.([]any) {
		out = append(out, v.(string))
	}
	return out
}
