package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// sharedTraces is the trace directory: $RIALTO_TRACES, or that of the
// development setup relative to the package (which a worktree elsewhere
// does not have); tests that need it skip when it is absent.
var sharedTraces = func() string {
	if d := os.Getenv("RIALTO_TRACES"); d != "" {
		return d
	}
	return "../../../shared/data/traces"
}()

func TestReadTrace(t *testing.T) {
	nodes, err := ReadTraceNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,96000,786432,8,V100M32\n"))
	if err != nil || len(nodes) != 2 || nodes[1].GPUs != 8 || nodes[1].Model != "V100M32" {
		t.Fatalf("nodes %+v err %v", nodes, err)
	}
	pods, err := ReadTracePods(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n" +
		"p0,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497\np1,16000,32768,1,220,V100M16|V100M32,LS,Running,9967058,9968575,9967063\n"))
	if err != nil || len(pods) != 2 || pods[1].GPUMilli != 220 || len(pods[1].GPUSpec) != 2 || pods[0].Duration() != 10769854-9437497 {
		t.Fatalf("pods %+v err %v", pods, err)
	}
	for _, bad := range []string{"", "name\nx\n", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,-1,0,0,0\n", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,5000\n"} {
		if _, err := ReadTracePods(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestReadOpenbTrace(t *testing.T) {
	dir := filepath.Join(sharedTraces, "alibaba-gpu-v2023")
	f, err := os.Open(filepath.Join(dir, "openb_node_list_all_node.csv"))
	if err != nil {
		t.Skip("traces absent:", err)
	}
	defer f.Close()
	nodes, err := ReadTraceNodes(f)
	if err != nil || len(nodes) != 1523 {
		t.Fatalf("%d nodes, err %v", len(nodes), err)
	}
	g, err := os.Open(filepath.Join(dir, "openb_pod_list_default.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	pods, err := ReadTracePods(g)
	if err != nil || len(pods) != 8152 {
		t.Fatalf("%d pods, err %v", len(pods), err)
	}
}

func FuzzReadTracePods(f *testing.F) {
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\np,1,2,1,500,A|B,LS,Running,1,5,2\n")
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1e3,2,1,NaN\n")
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,G1\n")
	f.Fuzz(func(t *testing.T, s string) {
		pods, err := ReadTracePods(strings.NewReader(s))
		if err == nil {
			for _, p := range pods {
				if p.CPUMilli < 0 || p.GPUMilli > 1000 || p.NumGPU < 0 {
					t.Fatalf("bad pod %+v", p)
				}
			}
		}
		nodes, err := ReadTraceNodes(strings.NewReader(s))
		if err == nil {
			for _, n := range nodes {
				if n.GPUs < 0 || n.CPUMilli < 0 {
					t.Fatalf("bad node %+v", n)
				}
			}
		}
	})
}

// endless is a file that never ends (a trace option pointed at /dev/zero,
// or a line without end): parsers must give up at MaxTraceBytes.
type endless struct{ b byte }

func (e endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = e.b
	}
	return len(p), nil
}

// TestReadTraceNodesRejects: a node list whose nodes cannot be told apart
// (the replay's placement knows nodes and their GPUs by name), one with
// more GPUs than a replay holds, and a file larger than any trace are
// refused with what is wrong, not replayed on merged nodes or read until
// memory runs out.
func TestReadTraceNodesRejects(t *testing.T) {
	const head = "sn,cpu_milli,memory_mib,gpu,model\n"
	for _, tc := range []struct{ in, want string }{
		{head + "n0,1000,1000,2,A\nn0,1000,1000,2,A\n", `row 3: node "n0" already on row 2`},
		{head + "n0,1000,1000,2,A\n,1000,1000,2,A\n", "row 3: node without a name"},
		{head + strings.Repeat("n,1,1,1024,A\n", 1), ""},
		{"sn,cpu_milli,memory_mib,gpu,gpu\nn0,1,1,1,1\n", `column "gpu" twice`},
	} {
		_, err := ReadTraceNodes(strings.NewReader(tc.in))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.want != "" && (err == nil || !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: got %v, want %q", tc.in, err, tc.want)
		}
	}
	var many strings.Builder
	many.WriteString(head)
	for i := 0; i <= MaxTraceGPUs/1024; i++ {
		fmt.Fprintf(&many, "n%d,1,1,1024,A\n", i)
	}
	if _, err := ReadTraceNodes(strings.NewReader(many.String())); err == nil || !strings.Contains(err.Error(), "GPUs in the node list") {
		t.Errorf("%d GPUs: %v", MaxTraceGPUs+1024, err)
	}
	// A line without end (a field per comma) stops at MaxTraceLine.
	for _, r := range []io.Reader{endless{'x'}, endless{','}, io.MultiReader(strings.NewReader(head+"n0,1,1,1,"), endless{'a'})} {
		if _, err := ReadTraceNodes(r); !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "a line longer than") {
			t.Errorf("endless line: %v", err)
		}
	}
	// Endless rows or bytes stop at the (here lowered) limits.
	saved := traceLimits
	t.Cleanup(func() { traceLimits = saved })
	traceLimits.rows, traceLimits.bytes = 100, 1<<20
	if _, err := ReadTracePods(io.MultiReader(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"), endless{'\n'})); !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("endless empty lines: %v", err)
	}
	var rows strings.Builder
	rows.WriteString("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
	for i := 0; i <= 100; i++ {
		rows.WriteString("p,1,1,0,0\n")
	}
	if _, err := ReadTracePods(strings.NewReader(rows.String())); !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "more than 100 rows") {
		t.Errorf("101 rows: %v", err)
	}
}

// openbFS is a trace directory holding one node list and one pod list.
func openbFS(nodes, pods string) fstest.MapFS {
	return fstest.MapFS{
		"alibaba-gpu-v2023/openb_node_list_all_node.csv": {Data: []byte(nodes)},
		"alibaba-gpu-v2023/openb_pod_list_default.csv":   {Data: []byte(pods)},
	}
}

// TestGPUOpenbUserTrace: gpu-openb replays any pod list on any node list
// of openb's format, and its notes describe the trace it replayed (not the
// shared trace's 98% of the GPUs); a cancelled run stops.
func TestGPUOpenbUserTrace(t *testing.T) {
	const pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n" +
		"p0,1000,1000,1,500,,LS,Running,0,100,0\n"
	traces := openbFS("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,8000,2,A\n", pods)
	r, err := Run(context.Background(), "gpu-openb", Options{Traces: traces})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(r.Notes, "\n"), "1 nodes, 1 pods; ") || !strings.Contains(strings.Join(r.Notes, "\n"), "they ask for 25% of the GPUs, 50% in whole GPUs") {
		t.Errorf("notes do not describe the replayed trace:\n%s", strings.Join(r.Notes, "\n"))
	}
	dup := openbFS("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,8000,2,A\nn0,8000,8000,2,A\n", pods)
	if _, err := Run(context.Background(), "gpu-openb", Options{Traces: dup}); !errors.Is(err, ErrTrace) {
		t.Errorf("duplicate node names: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	nodes, ps, err := LoadOpenb(traces, "")
	if err != nil {
		t.Fatal(err)
	}
	many := make([]TracePod, 10000)
	for i := range many {
		many[i] = ps[0]
	}
	cfg := DefaultGPUReplay
	cfg.Policy = PolicyRialto
	if _, err := ReplayGPU(ctx, nodes, many, cfg); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled replay: %v", err)
	}
}
