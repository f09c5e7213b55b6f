package placement

// How explanations name nodes and devices: by the names users know them
// by, with the ID after ("node n2 (node-…)", "n2/disk0 (dev-…)"), or by
// the ID alone when the snapshot gives no name (the simulator's, tests').

import "strings"

// nodeText names node ID id in an explanation: "node n2 (node-…)", or
// "node <id>" when it has no name (or an unknown node).
func (x *Index) nodeText(id string) string {
	if i, ok := x.nodeByID[id]; ok {
		if n := x.nodes[i].Name; n != "" && n != id {
			return "node " + n + " (" + id + ")"
		}
	}
	return "node " + id
}

// vertexText names fabric vertex id: a node as nodeText does when it is
// a named node, else the ID (a switch, a PCIe root).
func (x *Index) vertexText(id string) string {
	if i, ok := x.nodeByID[id]; ok && x.nodes[i].Name != "" && x.nodes[i].Name != id {
		return x.nodeText(id)
	}
	return id
}

// nodeName is the name of ds's node, or its ID when it has none.
func (x *Index) nodeName(ds *devState) string {
	if ds.node >= 0 {
		if n := x.nodes[ds.node].Name; n != "" {
			return n
		}
	}
	return ds.dev.Node
}

// devText names ds in an explanation: "n2/disk0 (dev-…)", or its ID when
// it has no name.
func (x *Index) devText(ds *devState) string {
	if ds.dev.Name == "" || ds.dev.Name == ds.dev.ID {
		return ds.dev.ID
	}
	return x.nodeName(ds) + "/" + ds.dev.Name + " (" + ds.dev.ID + ")"
}

// label is how explanations name an option: "shared n2/disk0 (dev-…)",
// "composed n2/disk0 (dev-…)+n3/disk0 (dev-…)"; "" when none of its
// devices has a name (explanations then use its name, node and device
// IDs). Unlike name it is not a ranking key.
func (x *Index) label(res *result) string {
	named := false
	for _, di := range res.opt.devs {
		if d := &x.devs[di].dev; d.Name != "" && d.Name != d.ID {
			named = true
			break
		}
	}
	if !named {
		return ""
	}
	var b strings.Builder
	b.WriteString(res.opt.mode)
	for i, di := range res.opt.devs {
		if i == 0 {
			b.WriteByte(' ')
		} else {
			b.WriteByte('+')
		}
		ds := &x.devs[di]
		if ds.dev.Name == "" || ds.dev.Name == ds.dev.ID {
			b.WriteString(ds.dev.Node + "/" + ds.dev.ID)
			continue
		}
		b.WriteString(x.devText(ds))
	}
	return b.String()
}

// optionText is how explanations name an option: its label, or its name
// when its devices have none.
func (x *Index) optionText(res *result) string {
	if l := x.label(res); l != "" {
		return l
	}
	return x.name(res)
}

// devRejection is a rejection of device ds.
func (x *Index) devRejection(ds *devState, constraint, reason string) Rejection {
	r := Rejection{Candidate: ds.dev.ID, Constraint: constraint, Reason: reason}
	if t := x.devText(ds); t != ds.dev.ID {
		r.Name = t
	}
	return r
}
