package lab

import (
	"context"
	"errors"
	"fmt"

	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/sim"
)

func init() {
	counterparts["link-sharing"] = func(ctx context.Context, res *sim.Result) error {
		if err := netns.Available(); err != nil {
			res.Notes = append(res.Notes, "real counterpart not run: "+err.Error())
			return nil
		}
		rows, err := RunWriters(ctx, WritersConfig{Lenders: []int{1, 3}, Writers: []int{1, 6}, Bytes: sim.LinkSharingBytes})
		if err != nil {
			return err
		}
		for _, row := range rows {
			mean := 0.0
			for _, v := range row.RealWhole {
				mean += v
			}
			mean /= float64(len(row.RealWhole))
			if !setReal(res, sim.LinkSharingMetric(row.Lenders, row.Writers), sim.Real{Value: mean / 1e6, Tolerance: 0.1,
				Note: fmt.Sprintf("mean of the writers; worst writer %.1f%% off; links busy %.0f%%", 100*row.MaxWholeError(), 100*row.LinkBusy)}) {
				return errors.New("lab: link-sharing: the experiment's metrics changed")
			}
		}
		return nil
	}
}
