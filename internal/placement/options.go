package placement

// candPrefix is how many candidates Place orders up front (at least the
// six shared options and the widest composition).
const candPrefix = 8

type option struct {
	mode    string
	devs    []int32
	partLen int64
}

// distinctLenders returns w devices on w different nodes: of the n
// candidates at(0), at(1), ... (best first), the first that keep holds for
// on each node; nil when fewer than w nodes have one.
func (x *Index) distinctLenders(n int, at func(k int) *cand, w int, keep func(c *cand) bool) []int32 {
	var devs []int32
next:
	for k := range n {
		c := at(k)
		if !keep(c) {
			continue
		}
		node := x.devs[c.dev].dev.Node
		for _, d := range devs {
			if x.devs[d].dev.Node == node {
				continue next
			}
		}
		devs = append(devs, c.dev)
		if len(devs) == w {
			return devs
		}
	}
	return nil
}
