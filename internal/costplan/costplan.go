package costplan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Kind is a deployment layout.
type Kind string

// Layouts.
const (
	// CPUOnly runs the function on the host CPUs, as today.
	CPUOnly Kind = "cpu-only"
	// CoLocated offloads it to accelerators attached to (and sized with)
	// the CPU servers: the paper's PCIe layout.
	CoLocated Kind = "co-located"
	// Disaggregated offloads it to network-attached accelerator appliances
	// that scale independently of the CPU servers (the paper's lesson,
	// Rialto's appliance).
	Disaggregated Kind = "disaggregated"
)

// Rounding turns a fractional unit count into units.
type Rounding string

// Roundings. Up never under-provisions; Nearest is what the paper did
// (1,171.2 NP10s instances became 1,171).
const (
	RoundUp      Rounding = "up"
	RoundNearest Rounding = "nearest"
)

// Option is one deployment to price.
type Option struct {
	Site    string `json:"site"`    // "on-prem", "aws", "azure", ...
	Name    string `json:"name"`    // "Original engine", "With ERBIUM", ...
	Element string `json:"element"` // what a unit is: "CPU + Alveo U55c", "f1.2xlarge"
	Kind    Kind   `json:"kind"`
	// Price of one unit: UnitCost (USD, one-off) on premises, Hourly
	// (USD/h) in a cloud. Exactly one is set.
	UnitCost float64 `json:"unit_cost,omitempty"`
	Hourly   float64 `json:"hourly,omitempty"`
	// VCPUs of a unit's host CPU; 0 means the same as today's servers.
	VCPUs int `json:"vcpus,omitempty"`
	// AccelsPerUnit is the accelerators a co-located unit carries (default 1).
	AccelsPerUnit int `json:"accels_per_unit,omitempty"`
	// Disaggregated only: the price of one appliance (same currency basis
	// as the unit price) and its accelerators.
	ApplianceCost   float64 `json:"appliance_cost,omitempty"`
	ApplianceHourly float64 `json:"appliance_hourly,omitempty"`
	AccelsPerAppl   int     `json:"accels_per_appliance,omitempty"`
}

// Inputs describe today's fleet, the function and the prices.
type Inputs struct {
	Servers       int     `json:"servers"`        // CPU servers today, fully loaded
	ServerVCPUs   int     `json:"server_vcpus"`   // vCPUs per server today
	FunctionShare float64 `json:"function_share"` // host CPU share the function takes today (0..1)
	// ResidualShare is the host CPU the offloaded function still takes
	// (encoding queries, the wrapper, messaging), as a share of today's CPU.
	ResidualShare float64 `json:"residual_share"`
	// Load is the function's peak demand (e.g. queries/s) and
	// SlotThroughput what one accelerator slot sustains (measured); with
	// SlotsPerAccel they size the accelerators. Load 0 skips the check.
	Load           float64  `json:"load,omitempty"`
	SlotThroughput float64  `json:"slot_throughput,omitempty"`
	SlotsPerAccel  int      `json:"slots_per_accel,omitempty"`
	HoursPerYear   float64  `json:"hours_per_year,omitempty"` // default 8760
	Rounding       Rounding `json:"rounding,omitempty"`
	Options        []Option `json:"options"`
}

// Row is the result for one option.
type Row struct {
	Option
	Units       int     // servers or instances
	Accels      int     // accelerators provisioned
	Utilisation float64 // Load / accelerator capacity (0 when Load is 0)
	Total       float64 // USD (one-off) or USD per year
	PerYear     bool
	Note        string
}

// Result is Compute's answer.
type Result struct {
	Inputs Inputs
	// CPUDemand is the vCPUs the rest of the application still needs
	// once the function is offloaded.
	CPUDemand float64
	Rows      []Row
}

// ErrInputs reports inconsistent inputs.
var ErrInputs = errors.New("costplan: bad inputs")

// maxCount bounds the counts of the inputs (servers, vCPUs, accelerators
// per unit, …): products of two of them are far from overflowing.
const maxCount = 1 << 20

// maxUnits bounds a count Compute derives (units, accelerators,
// appliances) before it converts it to an int.
const maxUnits = 1 << 52

// Validate checks in.
func (in Inputs) Validate() error {
	switch {
	case in.Servers <= 0 || in.ServerVCPUs <= 0:
		return fmt.Errorf("%w: servers and vCPUs per server must be positive", ErrInputs)
	case in.Servers > maxCount || in.ServerVCPUs > maxCount || in.SlotsPerAccel > maxCount:
		return fmt.Errorf("%w: servers, vCPUs per server and slots per accelerator must be at most %d", ErrInputs, maxCount)
	case in.SlotThroughput < 0 || in.SlotsPerAccel < 0 || in.HoursPerYear < 0:
		return fmt.Errorf("%w: slot throughput, slots per accelerator and hours per year cannot be negative", ErrInputs)
	case in.FunctionShare < 0 || in.FunctionShare >= 1 || in.ResidualShare < 0 || in.ResidualShare > in.FunctionShare:
		return fmt.Errorf("%w: want 0 <= residual share <= function share < 1", ErrInputs)
	case in.Load < 0 || (in.Load > 0 && in.SlotThroughput <= 0):
		return fmt.Errorf("%w: a load needs a positive per-slot throughput", ErrInputs)
	case in.Rounding != "" && in.Rounding != RoundUp && in.Rounding != RoundNearest:
		return fmt.Errorf("%w: rounding %q", ErrInputs, in.Rounding)
	}
	for _, o := range in.Options {
		if o.VCPUs < 0 || o.AccelsPerUnit < 0 || o.AccelsPerAppl < 0 || o.UnitCost < 0 || o.Hourly < 0 || o.ApplianceCost < 0 || o.ApplianceHourly < 0 {
			return fmt.Errorf("%w: option %q/%q: counts and prices cannot be negative", ErrInputs, o.Site, o.Element)
		}
		if o.VCPUs > maxCount || o.AccelsPerUnit > maxCount || o.AccelsPerAppl > maxCount {
			return fmt.Errorf("%w: option %q/%q: counts must be at most %d", ErrInputs, o.Site, o.Element, maxCount)
		}
		if (o.UnitCost > 0) == (o.Hourly > 0) {
			return fmt.Errorf("%w: option %q/%q needs exactly one of unit cost and hourly price", ErrInputs, o.Site, o.Element)
		}
		switch o.Kind {
		case CPUOnly, CoLocated:
		case Disaggregated:
			if (o.UnitCost > 0 && o.ApplianceCost <= 0) || (o.Hourly > 0 && o.ApplianceHourly <= 0) {
				return fmt.Errorf("%w: disaggregated option %q needs an appliance price on the same basis", ErrInputs, o.Name)
			}
		default:
			return fmt.Errorf("%w: option kind %q", ErrInputs, o.Kind)
		}
	}
	return nil
}

func (in Inputs) round(x float64) int {
	if in.Rounding == RoundNearest {
		return int(math.Round(x))
	}
	return int(math.Ceil(x - 1e-9))
}

// Compute prices every option.
func Compute(in Inputs) (Result, error) {
	if err := in.Validate(); err != nil {
		return Result{}, err
	}
	if in.HoursPerYear == 0 {
		in.HoursPerYear = 8760
	}
	if in.SlotsPerAccel <= 0 {
		in.SlotsPerAccel = 1
	}
	today := float64(in.Servers * in.ServerVCPUs)
	res := Result{Inputs: in, CPUDemand: today * (1 - in.FunctionShare + in.ResidualShare)}
	accelCap := in.SlotThroughput * float64(in.SlotsPerAccel)
	for _, o := range in.Options {
		r := Row{Option: o}
		vcpus := o.VCPUs
		if vcpus == 0 {
			vcpus = in.ServerVCPUs
		}
		price := o.UnitCost
		if o.Hourly > 0 {
			price, r.PerYear = o.Hourly*in.HoursPerYear, true
		}
		switch o.Kind {
		case CPUOnly:
			r.Units = in.round(today / float64(vcpus))
			r.Total = float64(r.Units) * price
		case CoLocated:
			per := max(o.AccelsPerUnit, 1)
			r.Units = in.round(res.CPUDemand / float64(vcpus))
			r.Accels = r.Units * per
			if in.Load > 0 {
				if in.Load/accelCap > maxUnits {
					return Result{}, tooLarge(o)
				}
				if need := int(math.Ceil(in.Load / accelCap)); need > r.Accels {
					r.Units = int(math.Ceil(float64(need) / float64(per)))
					r.Accels = r.Units * per
					r.Note = "sized by accelerator throughput"
				}
				r.Utilisation = in.Load / (float64(r.Accels) * accelCap)
			}
			r.Total = float64(r.Units) * price
		case Disaggregated:
			per := max(o.AccelsPerAppl, 1)
			r.Units = in.round(res.CPUDemand / float64(vcpus))
			appls := 1
			if in.Load > 0 {
				if in.Load/(accelCap*float64(per)) > maxUnits {
					return Result{}, tooLarge(o)
				}
				appls = int(math.Ceil(in.Load / (accelCap * float64(per))))
			}
			r.Accels = appls * per
			if in.Load > 0 {
				r.Utilisation = in.Load / (float64(r.Accels) * accelCap)
			}
			ap := o.ApplianceCost
			if r.PerYear {
				ap = o.ApplianceHourly * in.HoursPerYear
			}
			r.Total = float64(r.Units)*price + float64(appls)*ap
			r.Note = fmt.Sprintf("+ %d appliance(s)", appls)
		}
		if !finite(r.Total) || !finite(r.Utilisation) || r.Units < 0 || r.Accels < 0 {
			return Result{}, tooLarge(o)
		}
		res.Rows = append(res.Rows, r)
	}
	return res, nil
}

// finite reports whether x is a number, not infinite or NaN.
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// tooLarge is Compute's refusal of inputs whose plan for o overflows.
func tooLarge(o Option) error {
	return fmt.Errorf("%w: option %q/%q: the prices, load or throughput are too large to compute a plan", ErrInputs, o.Site, o.Element)
}

// ParseInputs reads Inputs as JSON (the format of testdata/paper.json),
// refusing unknown fields, and validates them.
func ParseInputs(r io.Reader) (Inputs, error) {
	var in Inputs
	d := json.NewDecoder(r)
	d.DisallowUnknownFields()
	if err := d.Decode(&in); err != nil {
		return in, fmt.Errorf("%w: %v", ErrInputs, err)
	}
	return in, in.Validate()
}

// PaperInputs are the inputs of Table 1 of the ERBIUM paper: 400 servers (c5.12xlarge-
// sized, 48 vCPUs), MCT at 40 % of CPU time; 244 servers remain after the
// offload, i.e. a residual host share of 1 % (400 × (1 − 0.40 + 0.01));
// prices as in the table (one-year savings plans for cloud instances).
func PaperInputs() Inputs {
	return Inputs{
		Servers: 400, ServerVCPUs: 48, FunctionShare: 0.40, ResidualShare: 0.01,
		Rounding: RoundNearest,
		Options: []Option{
			{Site: "on-prem", Name: "Original engine", Element: "CPU", Kind: CPUOnly, UnitCost: 10_000},
			{Site: "on-prem", Name: "With ERBIUM", Element: "CPU + Alveo U200", Kind: CoLocated, UnitCost: 20_000},
			{Site: "on-prem", Name: "With ERBIUM", Element: "CPU + Alveo U55c", Kind: CoLocated, UnitCost: 13_000},
			{Site: "aws", Name: "Original engine", Element: "c5.12xlarge", Kind: CPUOnly, Hourly: 1.452, VCPUs: 48},
			{Site: "aws", Name: "With ERBIUM", Element: "f1.2xlarge", Kind: CoLocated, Hourly: 1.2266, VCPUs: 8},
			{Site: "azure", Name: "Original engine", Element: "F48s v2", Kind: CPUOnly, Hourly: 1.2084, VCPUs: 48},
			{Site: "azure", Name: "With ERBIUM", Element: "NP10s", Kind: CoLocated, Hourly: 1.0411, VCPUs: 10},
		},
	}
}

// Money formats USD as the paper does: "4.88 M", "13 k".
func Money(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v/1e6), "0"), ".") + " M"
	case v >= 1e3:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v/1e3), "0"), ".") + " k"
	}
	return fmt.Sprintf("%.4g", v)
}

// Format writes the result as a table in the layout of Table 1 of the
// ERBIUM paper.
func Format(w io.Writer, r Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Site\tDeployment\tElement\tUnits\tUnit cost (USD)\tTotal (USD)\tNote\n")
	for _, row := range r.Rows {
		unit, total := Money(row.UnitCost), Money(row.Total)
		if row.PerYear {
			unit = fmt.Sprintf("%g/h", row.Hourly)
			total += "/year"
		}
		note := row.Note
		if row.Utilisation > 0 {
			note = strings.TrimSpace(fmt.Sprintf("%s accel. utilisation %.0f%%", note, 100*row.Utilisation))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", row.Site, row.Name, row.Element, row.Units, unit, total, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nCPU still needed after offload: %.0f vCPUs (%d × %d × (1 − %.2f + %.2f)); %.0f h/year.\n",
		r.CPUDemand, r.Inputs.Servers, r.Inputs.ServerVCPUs, r.Inputs.FunctionShare, r.Inputs.ResidualShare, r.Inputs.HoursPerYear)
	return err
}
