package main

import (
	"context"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestCharacterizeAmbiguousNodeName: names are not unique. Another machine
// joins under a live lender's name with a device of the same name:
// `rialto characterize NODE/DEV` refuses the name, and its error names
// the devices by ID (NODE/DEV alone is the same for both), so that the
// user can give one.
func TestCharacterizeAmbiguousNodeName(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx := context.Background()
	rt := t.TempDir()
	c.JoinAgentless(c.Nodes[0].Name, "another-machine", 1<<20)
	devs, err := c.Client().Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range devs {
		if d.Name == "disk0" {
			ids = append(ids, d.ID)
		}
	}
	if len(ids) != 2 {
		t.Fatalf("devices named disk0: %v", ids)
	}
	_, errs, code := runIn(t, c, rt, "characterize", c.Nodes[0].Name+"/disk0")
	if code == 0 || !strings.Contains(errs, "ambiguous") || !strings.Contains(errs, ids[0]) || !strings.Contains(errs, ids[1]) {
		t.Fatalf("characterize of a device name two live nodes of one name have: exit %d: %s", code, errs)
	}
}
