package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/internal/costplan"
)

func init() {
	register(&command{Name: "cost", Aliases: []string{"plan"}, Deprecated: "use rialto cost", Summary: "Cost calculator: price accelerator deployments (the ERBIUM paper's calculator, Maschi and Alonso): servers and cost of each.", Flags: runPlan})
}

// planDeployment is one row of plan's JSON output.
type planDeployment struct {
	ID          string        `json:"id"`    // site/name/element
	State       string        `json:"state"` // ok
	Site        string        `json:"site"`
	Name        string        `json:"name"`
	Element     string        `json:"element"`
	Kind        costplan.Kind `json:"kind"`
	Units       int           `json:"units"`
	Accels      int           `json:"accels,omitempty"`
	Utilisation float64       `json:"utilisation,omitempty"`
	UnitCost    float64       `json:"unit_cost,omitempty"`
	Hourly      float64       `json:"hourly,omitempty"`
	TotalUSD    float64       `json:"total_usd"`
	PerYear     bool          `json:"per_year"`
	Note        string        `json:"note,omitempty"`
}

type planOutput struct {
	ID          string           `json:"id"`
	State       string           `json:"state"`
	CPUDemand   float64          `json:"cpu_demand_vcpus"`
	Inputs      costplan.Inputs  `json:"inputs"`
	Deployments []planDeployment `json:"deployments"`
}

func runPlan(e *env, fs *pflag.FlagSet) runFunc {
	inputs := fs.String("inputs", "", "`file` of inputs as JSON, also @FILE (default: the inputs of Table 1 of the ERBIUM paper; see --print-inputs)")
	printInputs := fs.Bool("print-inputs", false, "print the inputs as JSON (a template for --inputs) and exit")
	output := outputVar(fs)
	return func(ctx context.Context, _ []string) error {
		in := costplan.PaperInputs()
		if *inputs != "" {
			*inputs = strings.TrimPrefix(*inputs, "@")
			f, err := os.Open(*inputs)
			if err != nil {
				return err
			}
			in, err = costplan.ParseInputs(f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", *inputs, err)
			}
		}
		if *printInputs {
			return output.print(e.stdout, in)
		}
		res, err := costplan.Compute(in)
		if err != nil {
			return err
		}
		if !output.structured() {
			if *inputs == "" {
				fmt.Fprintln(e.stdout, "Inputs: Table 1 of the ERBIUM paper (Maschi and Alonso, \"The Difficult Balance Between Modern Hardware and Conventional CPUs\"); rialto cost --print-inputs shows them; edit and pass --inputs.")
				fmt.Fprintln(e.stdout)
			}
			return costplan.Format(e.stdout, res)
		}
		out := planOutput{ID: "plan", State: "ok", CPUDemand: res.CPUDemand, Inputs: res.Inputs, Deployments: []planDeployment{}}
		for _, r := range res.Rows {
			out.Deployments = append(out.Deployments, planDeployment{
				ID: strings.Join([]string{r.Site, r.Name, r.Element}, "/"), State: "ok",
				Site: r.Site, Name: r.Name, Element: r.Element, Kind: r.Kind, Units: r.Units, Accels: r.Accels,
				Utilisation: r.Utilisation, UnitCost: r.UnitCost, Hourly: r.Hourly, TotalUSD: r.Total, PerYear: r.PerYear, Note: r.Note,
			})
		}
		return output.print(e.stdout, out)
	}
}
