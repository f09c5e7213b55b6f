package sim

// Figures are the paper figures the experiments use as inputs or compare
// with. A yes/no finding is 1 ("the paper finds it so"). Tolerance is the
// precision of the paper's statement ("about 40 M" is ±20%; a count of
// instances is exact); it is what a prediction must fall within to hit.
var Figures = []Figure{
	// Call et al.: SMUFIN on NVMe over Fabrics.
	{ID: "call/device-write", Paper: "call", Where: "§4.2", Claim: "one NVMe device writes 2 GB/s sequentially", Value: 2e9, Unit: "B/s"},
	{ID: "call/instance-rate", Paper: "call", Where: "§4.2", Claim: "a SMUFIN instance averages 477 MB/s", Value: 477e6, Unit: "B/s"},
	{ID: "call/instance-bytes", Paper: "call", Where: "§4.2", Claim: "an instance writes about 150 GB", Value: 150e9, Unit: "B"},
	{ID: "call/fig6-1dev", Paper: "call", Where: "Fig. 6(a)", Claim: "instances sharing one device degrade at 3", Value: 3, Unit: "instances"},
	{ID: "call/fig6-2dev", Paper: "call", Where: "Fig. 6(b)", Claim: "a 2-device composition degrades at 4 instances", Value: 4, Unit: "instances"},
	{ID: "call/fig6-3dev", Paper: "call", Where: "Fig. 6(c)", Claim: "a 3-device composition degrades at about 6 instances", Value: 6, Unit: "instances"},
	{ID: "call/fig7-falls", Paper: "call", Where: "Fig. 7", Claim: "delivered device bandwidth falls below its maximum as instances are added (yes = 1)", Value: 1},
	{ID: "call/fig8-b-fastest", Paper: "call", Where: "Fig. 8", Claim: "(b), all five on a 2-device composition, is the fastest of (a), (b), (c) (yes = 1)", Value: 1},
	{ID: "call/fig8-c-dedicated", Paper: "call", Where: "Fig. 8", Claim: "the dedicated instance of (c) is no faster than the instances of (b): time ratio ~1", Value: 1, Unit: "x", Tolerance: 0.1},
	{ID: "call/fig4-12", Paper: "call", Where: "Fig. 4", Claim: "NVMe-oF as fast as direct-attached with 1–2 instances on a node", Value: 1, Unit: "x", Tolerance: 0.01},
	{ID: "call/fig4-3", Paper: "call", Where: "Fig. 4", Claim: "NVMe-oF 6% slower than direct-attached with 3 instances on a node", Value: 0.06, Tolerance: 0.15},

	// Venice (Dong et al.).
	{ID: "venice/fig14-70", Paper: "venice", Where: "Fig. 14", Claim: "10,000 queries take 11,900 s with 70 MB", Value: 11900, Unit: "s", Tolerance: 0.1},
	{ID: "venice/fig14-350", Paper: "venice", Where: "Fig. 14", Claim: "10,000 queries take 758 s with 350 MB", Value: 758, Unit: "s", Tolerance: 0.1},
	{ID: "venice/fig14-speedup", Paper: "venice", Where: "Fig. 14", Claim: "15.7× faster from 70 MB to 350 MB", Value: 15.7, Unit: "x", Tolerance: 0.1},
	{ID: "venice/fig14-miss", Paper: "venice", Where: "Fig. 14", Claim: "miss rate near 5% at 350 MB", Value: 0.05, Tolerance: 0.3},
	{ID: "venice/fig14-local", Paper: "venice", Where: "Fig. 14", Claim: "all-local memory 7% faster than borrowed at 350 MB", Value: 1.07, Unit: "x", Tolerance: 0.03},
	{ID: "venice/fig14-slight", Paper: "venice", Where: "Fig. 14", Claim: "borrowed and local memory differ very slightly while misses dominate (here: within 2% at 70 MB)", Value: 1, Unit: "x", Tolerance: 0.02},
	{ID: "venice/fig15-min", Paper: "venice", Where: "Fig. 15", Claim: "smallest slowdown vs all-local with 75% borrowed: 1.03×", Value: 1.03, Unit: "x", Tolerance: 0.05},
	{ID: "venice/fig15-max", Paper: "venice", Where: "Fig. 15", Claim: "largest slowdown: 2.5×", Value: 2.5, Unit: "x", Tolerance: 0.1},
	{ID: "venice/fig15-ratio", Paper: "venice", Where: "Fig. 15", Claim: "direct and swap modes differ by up to 6.8×", Value: 6.8, Unit: "x", Tolerance: 0.1},
	{ID: "venice/fig18-qpair", Paper: "venice", Where: "§7.2, Fig. 18", Claim: "credits over the low-latency channel raise QPair bandwidth utilisation, from 28% to 51% (yes = 1)", Value: 1},
	{ID: "venice/fig16-nic-4B", Paper: "venice", Where: "Fig. 16(b)", Claim: "three remote NICs: ~40% of the bandwidth with 4 B packets", Value: 0.4, Tolerance: 0.2},
	{ID: "venice/fig16-nic-256B", Paper: "venice", Where: "Fig. 16(b)", Claim: "~85% with 256 B packets", Value: 0.85, Tolerance: 0.1},

	// ERBIUM (Maschi and Alonso).
	{ID: "erbium/kernel-floor", Paper: "erbium", Where: "§3.2, Fig. 3", Claim: "kernel time 70 µs for batches up to 64 queries", Value: 70e-6, Unit: "s"},
	{ID: "erbium/dma-half", Paper: "erbium", Where: "Fig. 9", Claim: "even 4 MiB transfers reach only half the PCIe bandwidth", Value: 0.5},
	{ID: "erbium/clock", Paper: "erbium", Where: "§3.3", Claim: "four engines run at a 30% lower clock", Value: 0.7},
	{ID: "erbium/standalone", Paper: "erbium", Where: "§1", Claim: "stand-alone ERBIUM: 50 M queries/s", Value: 50e6, Unit: "q/s"},
	{ID: "erbium/cpu-800x", Paper: "erbium", Where: "§1", Claim: "ERBIUM is 800× one CPU instance", Value: 800, Unit: "x"},
	{ID: "erbium/query-bytes", Paper: "erbium", Where: "§4.1", Claim: "64 B queries", Value: 64, Unit: "B"},
	{ID: "erbium/peak", Paper: "erbium", Where: "Fig. 6", Claim: "peak about 40 M queries/s with several process–worker pairs on one kernel", Value: 40e6, Unit: "q/s", Tolerance: 0.2},
	{ID: "erbium/pareto-throughput", Paper: "erbium", Where: "Fig. 8", Claim: "for ≥ 20 M queries/s the lowest latency is 4p4w1k4e (yes = 1)", Value: 1},
	{ID: "erbium/pareto-latency", Paper: "erbium", Where: "Fig. 8", Claim: "for ≤ 500 µs the highest throughput is 2p2w1k4e (yes = 1)", Value: 1},
	{ID: "erbium/related-extra", Paper: "erbium", Where: "§4.2, Fig. 10", Claim: "batching related queries checks 23% more queries than the CPU's early exit", Value: 0.23},
	{ID: "erbium/related-crossover", Paper: "erbium", Where: "§4.2, Fig. 10", Claim: "the CPU is faster up to ~400 queries per user request", Value: 400, Unit: "queries", Tolerance: 0.25},

	// Device Lending (Markussen et al.).
	{ID: "lending/ntb", Paper: "lending", Where: "§7.2.2", Claim: "an NTB adds 350–365 ns one way", Value: 350, Unit: "ns", Tolerance: 0.06},
	{ID: "lending/2l-1l", Paper: "lending", Where: "§7.2.2, Fig. 14", Claim: "2L-P2P-SW round trip a little more than 700 ns above 1L-P2P-SW, the NTB's 350 ns each way", Value: 700, Unit: "ns", Tolerance: 0.15},
	{ID: "lending/table1", Paper: "lending", Where: "Table 1, §7.2.2", Claim: "a lent GPU is as fast as a local one when the path is the same", Value: 1, Unit: "x", Tolerance: 0.01},
	{ID: "lending/via-ram", Paper: "lending", Where: "§7.2.2, Fig. 14", Claim: "counters in the borrower's RAM are slower than any peer-to-peer path: both GPUs must read (yes = 1)", Value: 1},
	{ID: "lending/vgg19", Paper: "lending", Where: "§7.5, Fig. 21", Claim: "VGG19 on 2 borrowed GPUs + NVMe runs as fast as local (direct paths)", Value: 1, Unit: "x", Tolerance: 0.02},
	{ID: "lending/vgg19-iommu", Paper: "lending", Where: "§7.5, Fig. 21", Claim: "forcing traffic through the lender's root increases the runtime (yes = 1)", Value: 1},

	// Network-attached FPGAs (Weerasinghe et al.).
	{ID: "fpga/min-frame", Paper: "fpga", Where: "§4", Claim: "the smallest Ethernet frame on the wire is 84 B", Value: 84, Unit: "B"},
	{ID: "fpga/line-rate-1B", Paper: "fpga", Where: "Fig. 6", Claim: "the FPGA sends 14.88 M messages/s at 1 B on 10 GbE (line rate)", Value: 14.88e6, Unit: "msg/s", Tolerance: 0.01},
	{ID: "fpga/formula-1472B", Paper: "fpga", Where: "§5", Claim: "goodput = line rate × payload/(payload + 66): 9.57 Gb/s at 1,472 B", Value: 10e9 * 1472 / (1472 + 66), Unit: "bit/s", Tolerance: 0.01},
	{ID: "fpga/native", Paper: "fpga", Where: "Fig. 6", Claim: "native Linux sends 0.32 M messages/s at 1 B", Value: 0.32e6, Unit: "msg/s"},
	{ID: "fpga/container", Paper: "fpga", Where: "Fig. 6", Claim: "a container sends 0.28 M messages/s at 1 B", Value: 0.28e6, Unit: "msg/s"},
	{ID: "fpga/vm", Paper: "fpga", Where: "Fig. 6", Claim: "a VM sends 0.2 M messages/s at 1 B", Value: 0.2e6, Unit: "msg/s"},
	{ID: "fpga/vs-native", Paper: "fpga", Where: "Fig. 6", Claim: "FPGA vs native messages/s at 1 B: 14.88 M / 0.32 M", Value: 14.88e6 / 0.32e6, Unit: "x", Tolerance: 0.02},
}

// Calibrations are the calibrated constants of the simulator's models and
// the figures each was copied from or tuned to.
var Calibrations = []Calibration{
	{Name: "CallNVMe", What: "block device model delivered(n) = max/(1+α(n−1)): max and the writers' rate copied; α from the one-device threshold alone (the geometric middle of the interval it allows)", Figures: []string{"call/device-write", "call/instance-rate", "call/fig6-1dev"}},
	{Name: "DefaultSmufin", What: "a SMUFIN-like writer: rate copied, bytes scaled 1/100", Figures: []string{"call/instance-rate", "call/instance-bytes"}},
	{Name: "DefaultSmufinHost", What: "host memory holds 2.5 instances (the paper's explanation of Fig. 4); the spill share is tuned to the 6%", Figures: []string{"call/fig4-12", "call/fig4-3"}},
	{Name: "DefaultRedis", What: "seven constants (keys, item and base size, Zipf skew, hit and miss times) tuned to four figures", Figures: []string{"venice/fig14-70", "venice/fig14-350", "venice/fig14-speedup", "venice/fig14-miss", "venice/fig14-local"}},
	{Name: "VeniceApps", What: "16 per-application assumptions (stall share, page reuse) chosen to span the figure's extremes, with DefaultMemoryModel's costs", Figures: []string{"venice/fig15-min", "venice/fig15-max", "venice/fig15-ratio"}},
	{Name: "DefaultErbium", What: "kernel floor, DMA efficiency, clock, engine rate (4 engines × 0.7 clock ≈ the stand-alone 50 M/s) and query size copied; the ZeroMQ, encoder, XRT and scheduling costs are assumptions, written with the peak of about 40 M queries/s among the figures the model was calibrated on (its first version, 9201ee5) and unchanged since", Figures: []string{"erbium/kernel-floor", "erbium/dma-half", "erbium/clock", "erbium/standalone", "erbium/query-bytes", "erbium/peak"}},
	{Name: "ErbiumRelated", What: "related-query batching: the CPU checks one query at 1/800 of the stand-alone rate; batches check 23% more", Figures: []string{"erbium/cpu-800x", "erbium/related-extra"}},
	{Name: "fabric.NTBCrossingLatency", What: "350 ns per NTB crossing, copied; the paper itself derives the 700 ns round-trip difference from it", Figures: []string{"lending/ntb", "lending/2l-1l"}},
	{Name: "hopScenarios", What: "roots, hops and NTB crossings per scenario, copied from Table 1 (equal paths explain the equal latencies)", Figures: []string{"lending/table1"}},
	{Name: "fabric.UDPThroughput", What: "the paper's goodput formula and minimum frame, copied (they give the line rate at every payload)", Figures: []string{"fpga/min-frame", "fpga/formula-1472B", "fpga/line-rate-1B"}},
	{Name: "VeniceVNIC", What: "the packet rate of Venice's front-end driver (IP over QPair), fitted to the 4 B figure with its three remote NICs; the wire bytes per packet are the network-attached FPGA paper's", Figures: []string{"venice/fig16-nic-4B"}},
	{Name: "udpStacks", What: "software stacks' message rates, copied", Figures: []string{"fpga/native", "fpga/container", "fpga/vm", "fpga/vs-native"}},
}
