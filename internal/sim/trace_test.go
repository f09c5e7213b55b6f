package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
