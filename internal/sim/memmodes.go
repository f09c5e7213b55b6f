package sim

// MemoryModel is the remote-memory access model of Venice (Dong et al.): a share Remote of an
// application's memory is borrowed; a cache miss to local memory costs
// Local; to borrowed memory it costs CRMA in direct mode (a cache-line fill
// over the fabric, ~the 1.4 µs P2P latency) or, in swap mode, a page fault
// PageFault (a 4 KiB RDMA fetch plus fault handling) once per page and Local
// afterwards — amortised over the Reuse accesses a page receives while
// resident. LocalSwap is the per-page cost of swapping to local storage
// (the normalisation of the paper's Fig. 15).
type MemoryModel struct {
	Remote                            float64
	Local, CRMA, PageFault, LocalSwap Time
}

// DefaultMemoryModel: 75% borrowed memory (Fig. 15), 100 ns DRAM miss, 1.5 µs
// CRMA fill, 12 µs RDMA page fault, 100 µs local SSD swap.
var DefaultMemoryModel = MemoryModel{Remote: 0.75, Local: 100e-9, CRMA: 1.5e-6, PageFault: 12e-6, LocalSwap: 100e-6}

// MemoryApp is an application's memory behaviour: Stall is the share of its
// all-local run time spent on memory misses, Reuse the accesses a page gets
// while resident (spatial and temporal locality).
type MemoryApp struct {
	Name         string
	Stall, Reuse float64
}

// VeniceApps are profiles for the applications of Venice's Table 2; they
// are assumptions (the paper gives no per-application miss rates) chosen so
// that the slowdowns span the paper's extremes, from random fine-grained
// access (graph analytics, OLTP) to streaming (grep, FFT).
var VeniceApps = []MemoryApp{
	{"Hadoop Grep", 0.02, 64},
	{"Spark CC", 0.10, 16},
	{"Graph500", 0.12, 1},
	{"Redis", 0.03, 4},
	{"BerkeleyDB", 0.13, 1.5},
	{"MySQL", 0.04, 8},
	{"PageRank", 0.14, 2},
	{"SPLASH2 FFT", 0.62, 512},
}

// Slowdowns returns the app's run time relative to all-local memory in
// direct (CRMA) mode, in swap-over-RDMA mode, and with local swapping.
func (m MemoryModel) Slowdowns(a MemoryApp) (direct, swap, localSwap float64) {
	per := func(remoteCost float64) float64 {
		// Memory time scales with the mean miss cost relative to local.
		return (1 - a.Stall) + a.Stall*((1-m.Remote)+m.Remote*remoteCost/m.Local)
	}
	direct = per(m.CRMA)
	swap = per(m.Local + m.PageFault/a.Reuse)
	localSwap = per(m.Local + m.LocalSwap/a.Reuse)
	return direct, swap, localSwap
}
