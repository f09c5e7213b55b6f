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

// Limits of what a trace parser reads from one file. The shared traces'
// largest file is 2.1 MB with lines under 200 bytes and 8,152 rows; a file
// far beyond them is not a trace (or is /dev/zero), and parsing it whole
// would hold it all in memory (a line of commas is a field per byte).
const (
	MaxTraceBytes = 64 << 20
	MaxTraceLine  = 64 << 10
	MaxTraceRows  = 1 << 20
)

// MaxTraceGPUs bounds the GPUs of a node list (openb's has 6,212): every
// GPU is a device of the replay's placement snapshots.
const MaxTraceGPUs = 1 << 20

// traceLimits are the limits csvTable applies (tests lower them).
var traceLimits = struct{ bytes, line, rows int64 }{MaxTraceBytes, MaxTraceLine, MaxTraceRows}

// limitedReader fails, rather than ends, past its limits (a truncated
// trace would parse as a shorter one): n bytes in all, line bytes without
// a newline.
type limitedReader struct {
	r       io.Reader
	n, line int64
	cur     int64
	err     error
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if l.n <= 0 {
		l.err = fmt.Errorf("%w: larger than %d bytes", ErrTrace, traceLimits.bytes)
		return 0, l.err
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	for i, b := range p[:n] {
		if b == '\n' {
			l.cur = 0
			continue
		}
		if l.cur++; l.cur > l.line {
			// Hand over what precedes the long line; fail the next read.
			l.err = fmt.Errorf("%w: a line longer than %d bytes", ErrTrace, l.line)
			if i == 0 {
				return 0, l.err
			}
			return i, nil
		}
	}
	return n, err
}

// csvRow is one record of a csvTable, its cells looked up by column name.
type csvRow struct {
	idx map[string]int
	rec []string
}

// get returns the named column's cell, trimmed ("" when the record is
// shorter than the header).
func (r csvRow) get(col string) string {
	if i, ok := r.idx[col]; ok && i < len(r.rec) {
		return strings.TrimSpace(r.rec[i])
	}
	return ""
}

// csvTable reads a CSV with a header (at most MaxTraceBytes of it) into
// rows looked up by column name.
func csvTable(r io.Reader, need ...string) ([]csvRow, error) {
	lr := &limitedReader{r: r, n: traceLimits.bytes, line: traceLimits.line}
	cr := csv.NewReader(lr)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = false
	head, err := cr.Read()
	if lr.err != nil {
		return nil, lr.err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrTrace, err)
	}
	idx := map[string]int{}
	for i, h := range head {
		h = strings.TrimSpace(h)
		if _, dup := idx[h]; dup && h != "" {
			return nil, fmt.Errorf("%w: header: column %q twice", ErrTrace, h)
		}
		idx[h] = i
	}
	for _, n := range need {
		if _, ok := idx[n]; !ok {
			return nil, fmt.Errorf("%w: missing column %q", ErrTrace, n)
		}
	}
	var out []csvRow
	line := 1
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		line++
		if lr.err != nil {
			return nil, fmt.Errorf("line %d: %w", line, lr.err)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrTrace, line, err)
		}
		if int64(len(out)) >= traceLimits.rows {
			return nil, fmt.Errorf("%w: more than %d rows", ErrTrace, traceLimits.rows)
		}
		out = append(out, csvRow{idx: idx, rec: rec})
	}
	return out, nil
}

func parseInt(row csvRow, col string, line int) (int64, error) {
	s := row.get(col)
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
	seen := make(map[string]int, len(rows))
	gpus := int64(0)
	for i, row := range rows {
		n := TraceNode{Name: row.get("sn"), Model: row.get("model")}
		// A node's name is its identity in the replay (placement's node
		// and device IDs): an empty or repeated one would merge nodes.
		if n.Name == "" {
			return nil, fmt.Errorf("%w: row %d: node without a name (sn)", ErrTrace, i+2)
		}
		if first, dup := seen[n.Name]; dup {
			return nil, fmt.Errorf("%w: row %d: node %q already on row %d", ErrTrace, i+2, n.Name, first)
		}
		seen[n.Name] = i + 2
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
		if gpus += g; gpus > MaxTraceGPUs {
			return nil, fmt.Errorf("%w: row %d: more than %d GPUs in the node list", ErrTrace, i+2, MaxTraceGPUs)
		}
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
		p := TracePod{Name: row.get("name"), QoS: row.get("qos"), Phase: row.get("pod_phase")}
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
		if s := row.get("gpu_spec"); s != "" && s != "nan" {
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
