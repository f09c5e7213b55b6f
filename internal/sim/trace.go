package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrTrace reports a malformed trace file.
var ErrTrace = errors.New("sim: malformed trace")

// TraceNode is a server of a cluster trace (Alibaba openb node list).
type TraceNode struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// TracePod is a task of a cluster trace (Alibaba openb pod list). Times are
// in seconds. GPUMilli is the share of one GPU for a GPU-sharing pod
// (NumGPU 1), 1000 for whole GPUs. GPUSpec lists acceptable GPU models
// (empty: any).
type TracePod struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	NumGPU    int
	GPUMilli  int64
	GPUSpec   []string
	QoS       string
	Phase     string
	Created   float64
	Deleted   float64
	Scheduled float64
}

// Duration is how long the pod ran in the trace.
func (p TracePod) Duration() float64 {
	start := p.Scheduled
	if start < p.Created {
		start = p.Created
	}
	return p.Deleted - start
}

// csvTable reads a CSV with a header into column lookups.
func csvTable(r io.Reader, need ...string) ([]map[string]string, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = false
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrTrace, err)
	}
	idx := map[string]int{}
	for i, h := range head {
		idx[strings.TrimSpace(h)] = i
	}
	for _, n := range need {
		if _, ok := idx[n]; !ok {
			return nil, fmt.Errorf("%w: missing column %q", ErrTrace, n)
		}
	}
	var out []map[string]string
	line := 1
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		line++
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrTrace, line, err)
		}
		row := make(map[string]string, len(idx))
		for name, i := range idx {
			if i < len(rec) {
				row[name] = strings.TrimSpace(rec[i])
			}
		}
		out = append(out, row)
	}
	return out, nil
}

func parseInt(row map[string]string, col string, line int) (int64, error) {
	s := row[col]
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != f || f > 1e15 || f < -1e15 {
			return 0, fmt.Errorf("%w: row %d: %s=%q", ErrTrace, line, col, s)
		}
		v = int64(f)
	}
	if v < 0 {
		return 0, fmt.Errorf("%w: row %d: %s negative", ErrTrace, line, col)
	}
	return v, nil
}

// ReadTraceNodes parses an openb node list (sn,cpu_milli,memory_mib,gpu,model).
func ReadTraceNodes(r io.Reader) ([]TraceNode, error) {
	rows, err := csvTable(r, "sn", "cpu_milli", "memory_mib", "gpu")
	if err != nil {
		return nil, err
	}
	out := make([]TraceNode, 0, len(rows))
	for i, row := range rows {
		n := TraceNode{Name: row["sn"], Model: row["model"]}
		var g int64
		if n.CPUMilli, err = parseInt(row, "cpu_milli", i+2); err != nil {
			return nil, err
		}
		if n.MemoryMiB, err = parseInt(row, "memory_mib", i+2); err != nil {
			return nil, err
		}
		if g, err = parseInt(row, "gpu", i+2); err != nil {
			return nil, err
		}
		if g > 1024 {
			return nil, fmt.Errorf("%w: row %d: %d GPUs", ErrTrace, i+2, g)
		}
		n.GPUs = int(g)
		if n.Model == "nan" {
			n.Model = ""
		}
		out = append(out, n)
	}
	return out, nil
}

// ReadTracePods parses an openb pod list. Lists without time columns (the
// multigpu50 sample) get creation times 0 and no duration.
func ReadTracePods(r io.Reader) ([]TracePod, error) {
	rows, err := csvTable(r, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	out := make([]TracePod, 0, len(rows))
	for i, row := range rows {
		line := i + 2
		p := TracePod{Name: row["name"], QoS: row["qos"], Phase: row["pod_phase"]}
		var v int64
		if p.CPUMilli, err = parseInt(row, "cpu_milli", line); err != nil {
			return nil, err
		}
		if p.MemoryMiB, err = parseInt(row, "memory_mib", line); err != nil {
			return nil, err
		}
		if v, err = parseInt(row, "num_gpu", line); err != nil {
			return nil, err
		}
		if v > 1024 {
			return nil, fmt.Errorf("%w: row %d: %d GPUs", ErrTrace, line, v)
		}
		p.NumGPU = int(v)
		if p.GPUMilli, err = parseInt(row, "gpu_milli", line); err != nil {
			return nil, err
		}
		if p.GPUMilli > 1000 {
			return nil, fmt.Errorf("%w: row %d: gpu_milli %d", ErrTrace, line, p.GPUMilli)
		}
		if s := row["gpu_spec"]; s != "" && s != "nan" {
			p.GPUSpec = strings.Split(s, "|")
		}
		for _, c := range []struct {
			col string
			dst *float64
		}{{"creation_time", &p.Created}, {"deletion_time", &p.Deleted}, {"scheduled_time", &p.Scheduled}} {
			if v, err = parseInt(row, c.col, line); err != nil {
				return nil, err
			}
			*c.dst = float64(v)
		}
		out = append(out, p)
	}
	return out, nil
}
