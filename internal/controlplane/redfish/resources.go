package redfish

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/placement"
)

const (
	pSystems      = "/redfish/v1/Systems"
	pChassis      = "/redfish/v1/Chassis"
	pComposition  = "/redfish/v1/CompositionService"
	pBlocks       = pComposition + "/ResourceBlocks"
	pZones        = pComposition + "/ResourceZones"
	pReservations = pComposition + "/CompositionReservations"
	pEvents       = "/redfish/v1/EventService"
	pSessions     = "/redfish/v1/SessionService/Sessions"
)

// view is what one request reads of the control plane.
type view struct {
	nodes   []api.Node
	devices []api.Device
	leases  []api.Lease // the caller's live leases (none for a node credential)
}

// load reads the inventory and, if withLeases, the caller's live leases.
func (s *Service) load(ctx context.Context, c *caller, withLeases bool) (*view, error) {
	var v view
	var err error
	if v.nodes, err = c.c.Nodes(ctx); err != nil {
		return nil, err
	}
	if v.devices, err = c.c.Devices(ctx); err != nil {
		return nil, err
	}
	sort.Slice(v.nodes, func(i, j int) bool { return v.nodes[i].Name < v.nodes[j].Name })
	sort.Slice(v.devices, func(i, j int) bool { return v.devices[i].ID < v.devices[j].ID })
	if withLeases {
		ls, err := c.c.Leases(ctx)
		if err != nil && !api.IsCode(err, api.CodeForbidden) { // a node credential has no leases
			return nil, err
		}
		v.leases = ls
		sort.Slice(v.leases, func(i, j int) bool { return v.leases[i].CreatedAt.Before(v.leases[j].CreatedAt) })
	}
	return &v, nil
}

func (v *view) node(id string) (api.Node, bool) {
	for _, n := range v.nodes {
		if n.ID == id {
			return n, true
		}
	}
	return api.Node{}, false
}

func (v *view) device(id string) (api.Device, bool) {
	for _, d := range v.devices {
		if d.ID == id {
			return d, true
		}
	}
	return api.Device{}, false
}

func (v *view) lease(id string) (api.Lease, bool) {
	for _, l := range v.leases {
		if l.ID == id {
			return l, true
		}
	}
	return api.Lease{}, false
}

func (s *Service) serviceRoot() obj {
	return obj{
		"@odata.id":          "/redfish/v1",
		"@odata.type":        typeOf("ServiceRoot"),
		"Id":                 "RootService",
		"Name":               "Rialto Redfish Service",
		"Description":        "The Rialto control plane's composition service: lendable devices as resource blocks, leases as composed systems.",
		"RedfishVersion":     "1.20.0",
		"UUID":               s.cfg.UUID,
		"Vendor":             "Rialto",
		"Product":            "Rialto control plane",
		"Systems":            link(pSystems),
		"Chassis":            link(pChassis),
		"CompositionService": link(pComposition),
		"EventService":       link(pEvents),
		"SessionService":     link("/redfish/v1/SessionService"),
		"Links":              obj{"Sessions": link(pSessions)},
		"ProtocolFeaturesSupported": obj{
			"ExcerptQuery": false, "ExpandQuery": obj{"ExpandAll": false, "Levels": false, "Links": false, "NoLinks": false},
			"FilterQuery": false, "OnlyMemberQuery": false, "SelectQuery": false,
		},
	}
}

// kindBlockType maps a device kind to its ResourceBlockType and zone.
func kindBlockType(k api.Kind) string {
	switch k {
	case api.KindBlock:
		return "Storage"
	case api.KindMemory:
		return "Memory"
	case api.KindAccel:
		return "Processor"
	case api.KindNIC:
		return "Network"
	}
	return "Expansion"
}

// zoneKinds are the resource zones: one per composable kind (a composed
// system is one lease, of one kind).
var zoneKinds = []api.Kind{api.KindBlock, api.KindMemory, api.KindAccel}

func statusOf(state, health string) obj {
	return obj{"State": state, "Health": health}
}

func nodeStatus(n api.Node) obj {
	switch n.State {
	case api.NodeReady:
		if n.Health != "" && n.Health != "ok" {
			return statusOf("Enabled", "Warning")
		}
		return statusOf("Enabled", "OK")
	case api.NodeSuspect:
		return statusOf("Enabled", "Warning")
	}
	return statusOf("UnavailableOffline", "Critical")
}

func leaseStatus(l api.Lease) obj {
	switch l.State {
	case api.LeaseActive:
		return statusOf("Enabled", "OK")
	case api.LeaseReserved, api.LeaseRequested:
		return statusOf("Starting", "OK")
	case api.LeaseReleasing:
		return statusOf("Disabled", "OK")
	}
	return statusOf("Disabled", "Critical")
}

func systemPath(id string) string { return pSystems + "/" + id }
func blockPath(id string) string  { return pBlocks + "/" + id }

// blockPaths are the resource blocks of a lease's parts, once each.
func blockPaths(l api.Lease) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range l.Parts {
		if !seen[p.DeviceID] {
			seen[p.DeviceID] = true
			out = append(out, blockPath(p.DeviceID))
		}
	}
	return out
}

func (s *Service) systems(ctx context.Context, c *caller) (obj, error) {
	v, err := s.load(ctx, c, true)
	if err != nil {
		return nil, err
	}
	var members []string
	for _, n := range v.nodes {
		members = append(members, systemPath(n.ID))
	}
	for _, l := range v.leases {
		if !s.reserved(l.ID) {
			members = append(members, systemPath(l.ID))
		}
	}
	o := collection(pSystems, "ComputerSystemCollection", "Computer systems: the nodes, and the composed systems (leases)", members)
	return o, nil
}

// systemTree serves a system and what hangs under it.
func (s *Service) systemTree(ctx context.Context, c *caller, id string, rest []string) (obj, error) {
	v, err := s.load(ctx, c, true)
	if err != nil {
		return nil, err
	}
	path := systemPath(id) + pathTail(rest)
	if n, ok := v.node(id); ok {
		if len(rest) > 0 {
			return nil, errNotFound(path)
		}
		return physicalSystem(n, v), nil
	}
	l, ok := v.lease(id)
	if !ok || s.reserved(id) {
		return nil, errNotFound(path)
	}
	return composedTree(l, rest, path)
}

func pathTail(rest []string) string {
	if len(rest) == 0 {
		return ""
	}
	return "/" + strings.Join(rest, "/")
}

func physicalSystem(n api.Node, v *view) obj {
	var blocks []string
	for _, d := range v.devices {
		if d.NodeID == n.ID {
			blocks = append(blocks, blockPath(d.ID))
		}
	}
	o := obj{
		"@odata.id":   systemPath(n.ID),
		"@odata.type": typeOf("ComputerSystem"),
		"Id":          n.ID,
		"Name":        n.Name,
		"Description": "A node running a Rialto agent; it lends the resource blocks linked.",
		"SystemType":  "Physical",
		"HostName":    n.Fingerprint.Hostname,
		"PowerState":  "On",
		"Status":      nodeStatus(n),
		"Links":       obj{"Chassis": links([]string{pChassis + "/" + n.ID}), "ResourceBlocks": links(blocks)},
	}
	if n.Fingerprint.Cores > 0 {
		o["ProcessorSummary"] = obj{"CoreCount": n.Fingerprint.Cores}
	}
	if n.Fingerprint.MemoryBytes > 0 {
		o["MemorySummary"] = obj{"TotalSystemMemoryGiB": float64(n.Fingerprint.MemoryBytes) / (1 << 30)}
	}
	return o
}

// composedTree serves a composed system (a lease) and its storage,
// volume, memory or processors.
func composedTree(l api.Lease, rest []string, path string) (obj, error) {
	sp := systemPath(l.ID)
	switch {
	case len(rest) == 0:
		name := l.Borrower
		if name == "" {
			name = "Composed system " + l.ID
		}
		o := obj{
			"@odata.id":   sp,
			"@odata.type": typeOf("ComputerSystem"),
			"Id":          l.ID,
			"Name":        name,
			"Description": fmt.Sprintf("Rialto lease %s: %s, %s, %d part(s); decompose (DELETE) to release it.", l.ID, l.Kind, l.Mode, len(l.Parts)),
			"SystemType":  "Composed",
			"PowerState":  "On",
			"Status":      leaseStatus(l),
			"Links":       obj{"ResourceBlocks": links(blockPaths(l))},
		}
		switch l.Kind {
		case api.KindBlock:
			o["Storage"] = link(sp + "/Storage")
		case api.KindMemory:
			o["Memory"] = link(sp + "/Memory")
			o["MemorySummary"] = obj{"TotalSystemMemoryGiB": float64(l.Held) / (1 << 30)}
		case api.KindAccel:
			o["Processors"] = link(sp + "/Processors")
		}
		return o, nil
	case l.Kind == api.KindBlock && len(rest) == 1 && rest[0] == "Storage":
		return collection(sp+"/Storage", "StorageCollection", "Storage of "+l.ID, []string{sp + "/Storage/1"}), nil
	case l.Kind == api.KindBlock && len(rest) == 2 && rest[0] == "Storage" && rest[1] == "1":
		return obj{
			"@odata.id":   sp + "/Storage/1",
			"@odata.type": typeOf("Storage"),
			"Id":          "1",
			"Name":        "Borrowed storage",
			"Description": "The lease's NBD export(s); the volume is what the borrower uses.",
			"Status":      leaseStatus(l),
			"Volumes":     link(sp + "/Storage/1/Volumes"),
		}, nil
	case l.Kind == api.KindBlock && len(rest) == 3 && rest[0] == "Storage" && rest[1] == "1" && rest[2] == "Volumes":
		return collection(sp+"/Storage/1/Volumes", "VolumeCollection", "Volumes of "+l.ID, []string{sp + "/Storage/1/Volumes/1"}), nil
	case l.Kind == api.KindBlock && len(rest) == 4 && rest[0] == "Storage" && rest[1] == "1" && rest[2] == "Volumes" && rest[3] == "1":
		return volume(l, sp), nil
	case l.Kind == api.KindMemory && len(rest) == 1 && rest[0] == "Memory":
		return collection(sp+"/Memory", "MemoryCollection", "Memory of "+l.ID, []string{sp + "/Memory/1"}), nil
	case l.Kind == api.KindMemory && len(rest) == 2 && rest[0] == "Memory" && rest[1] == "1":
		return obj{
			"@odata.id":   sp + "/Memory/1",
			"@odata.type": typeOf("Memory"),
			"Id":          "1",
			"Name":        "Borrowed memory",
			"CapacityMiB": l.Held >> 20,
			"MemoryType":  "DRAM",
			"Status":      leaseStatus(l),
		}, nil
	case l.Kind == api.KindAccel && len(rest) == 1 && rest[0] == "Processors":
		var ms []string
		for i := range l.Parts {
			ms = append(ms, fmt.Sprintf("%s/Processors/%d", sp, i+1))
		}
		return collection(sp+"/Processors", "ProcessorCollection", "Accelerator slots of "+l.ID, ms), nil
	case l.Kind == api.KindAccel && len(rest) == 2 && rest[0] == "Processors":
		for i := range l.Parts {
			if rest[1] == fmt.Sprint(i+1) {
				return obj{
					"@odata.id":     fmt.Sprintf("%s/Processors/%d", sp, i+1),
					"@odata.type":   typeOf("Processor"),
					"Id":            rest[1],
					"Name":          "Borrowed accelerator slot",
					"ProcessorType": "Accelerator",
					"Status":        leaseStatus(l),
				}, nil
			}
		}
	}
	return nil, errNotFound(path)
}

// volume is a block lease's volume. Its Oem.Rialto carries the NBD
// URI(s) (secrets: only the lease's tenant gets them) and how to use a
// composed one.
func volume(l api.Lease, sp string) obj {
	raid := "None"
	if l.Mode == api.ModeComposed {
		raid = "RAID0"
	}
	o := obj{
		"@odata.id":     sp + "/Storage/1/Volumes/1",
		"@odata.type":   typeOf("Volume"),
		"Id":            "1",
		"Name":          "Volume of " + l.ID,
		"CapacityBytes": l.Held, // what the borrower sees, not the size asked for
		"RAIDType":      raid,
		"Status":        leaseStatus(l),
		"Encrypted":     false,
	}
	if l.StripeUnit > 0 {
		o["StripSizeBytes"] = l.StripeUnit
	}
	var uris []string
	for _, p := range l.Parts {
		if p.URI != "" {
			uris = append(uris, p.URI)
		}
	}
	rialto := obj{"LeaseId": l.ID, "Mode": string(l.Mode)}
	if l.URI != "" {
		rialto["URI"] = l.URI
	}
	if len(uris) > 0 {
		rialto["PartURIs"] = uris
	}
	if l.Mode == api.ModeComposed {
		rialto["Attach"] = "rialto attach " + l.ID
	}
	o["Oem"] = obj{"Rialto": rialto}
	return o
}

func (s *Service) chassisCollection(ctx context.Context, c *caller) (obj, error) {
	v, err := s.load(ctx, c, false)
	if err != nil {
		return nil, err
	}
	var members []string
	for _, n := range v.nodes {
		members = append(members, pChassis+"/"+n.ID)
	}
	return collection(pChassis, "ChassisCollection", "Chassis: one per node", members), nil
}

func (s *Service) chassis(ctx context.Context, c *caller, id string) (obj, error) {
	v, err := s.load(ctx, c, false)
	if err != nil {
		return nil, err
	}
	n, ok := v.node(id)
	if !ok {
		return nil, errNotFound(pChassis + "/" + id)
	}
	var blocks []string
	for _, d := range v.devices {
		if d.NodeID == n.ID {
			blocks = append(blocks, blockPath(d.ID))
		}
	}
	return obj{
		"@odata.id":   pChassis + "/" + n.ID,
		"@odata.type": typeOf("Chassis"),
		"Id":          n.ID,
		"Name":        n.Name,
		"ChassisType": "RackMount",
		"Status":      nodeStatus(n),
		"Links":       obj{"ComputerSystems": links([]string{systemPath(n.ID)}), "ResourceBlocks": links(blocks)},
	}, nil
}

func (s *Service) compositionService() obj {
	return obj{
		"@odata.id":               pComposition,
		"@odata.type":             typeOf("CompositionService"),
		"Id":                      "CompositionService",
		"Name":                    "Rialto composition service",
		"Description":             "Compose systems from Rialto's lendable devices; a composed system is a lease.",
		"ServiceEnabled":          true,
		"Status":                  statusOf("Enabled", "OK"),
		"AllowOverprovisioning":   false,
		"AllowZoneAffinity":       true,
		"ResourceBlocks":          link(pBlocks),
		"ResourceZones":           link(pZones),
		"ActivePool":              link(pComposition + "/ActivePool"),
		"FreePool":                link(pComposition + "/FreePool"),
		"CompositionReservations": link(pReservations),
		"ReservationDuration":     isoDuration(s.cfg.ReservationDuration.Seconds()),
		"Actions": obj{"#CompositionService.Compose": obj{
			"target":                                pComposition + "/Actions/CompositionService.Compose",
			"RequestFormat@Redfish.AllowableValues": []string{"Manifest"},
			"RequestType@Redfish.AllowableValues":   []string{"Preview", "PreviewReserve", "Apply"},
		}},
	}
}

func isoDuration(sec float64) string {
	return fmt.Sprintf("PT%gS", sec)
}

// compositionState is a device's CompositionState from its allocation.
func compositionState(d api.Device) string {
	switch {
	case d.State != "" && d.State != "available":
		return "Unavailable"
	case d.Allocated <= 0:
		return "Unused"
	case d.Allocated < d.Capacity && d.Sharing != "exclusive":
		return "ComposedAndAvailable"
	}
	return "Composed"
}

// blockCollection lists every resource block, or (ActivePool, FreePool)
// those composed into a system or free.
func (s *Service) blockCollection(ctx context.Context, c *caller, which string) (obj, error) {
	v, err := s.load(ctx, c, false)
	if err != nil {
		return nil, err
	}
	var members []string
	for _, d := range v.devices {
		st := compositionState(d)
		switch which {
		case "ActivePool":
			if st != "Composed" && st != "ComposedAndAvailable" {
				continue
			}
		case "FreePool":
			if st != "Unused" && st != "ComposedAndAvailable" {
				continue
			}
		}
		members = append(members, blockPath(d.ID))
	}
	names := map[string]string{"ResourceBlocks": "Resource blocks: every lendable device", "ActivePool": "Resource blocks in use by composed systems", "FreePool": "Resource blocks with room for a composition"}
	return collection(pComposition+"/"+which, "ResourceBlockCollection", names[which], members), nil
}

// blockTree serves a resource block and its drive, memory or processor.
func (s *Service) blockTree(ctx context.Context, c *caller, id string, rest []string) (obj, error) {
	v, err := s.load(ctx, c, true)
	if err != nil {
		return nil, err
	}
	path := blockPath(id) + pathTail(rest)
	d, ok := v.device(id)
	if !ok {
		return nil, errNotFound(path)
	}
	bp := blockPath(d.ID)
	if len(rest) == 0 {
		return resourceBlock(d, v), nil
	}
	if len(rest) != 2 || rest[1] != d.ID {
		return nil, errNotFound(path)
	}
	n, _ := v.node(d.NodeID)
	name := n.Name + "/" + d.Name
	switch {
	case d.Kind == api.KindBlock && rest[0] == "Drives":
		o := obj{
			"@odata.id":     bp + "/Drives/" + d.ID,
			"@odata.type":   typeOf("Drive"),
			"Id":            d.ID,
			"Name":          name,
			"CapacityBytes": d.Capacity,
			"Status":        blockStatus(d, n),
		}
		if d.Model != "" {
			o["Model"] = d.Model
		}
		return o, nil
	case d.Kind == api.KindMemory && rest[0] == "Memory":
		return obj{
			"@odata.id":   bp + "/Memory/" + d.ID,
			"@odata.type": typeOf("Memory"),
			"Id":          d.ID,
			"Name":        name,
			"CapacityMiB": d.Capacity >> 20,
			"MemoryType":  "DRAM",
			"Status":      blockStatus(d, n),
		}, nil
	case d.Kind == api.KindAccel && rest[0] == "Processors":
		return obj{
			"@odata.id":     bp + "/Processors/" + d.ID,
			"@odata.type":   typeOf("Processor"),
			"Id":            d.ID,
			"Name":          name,
			"Description":   fmt.Sprintf("An accelerator appliance with %s (%s lent)", placement.FormatSlots(d.Capacity, api.SlotUnits), placement.FormatSlots(d.Allocated, api.SlotUnits)),
			"ProcessorType": "Accelerator",
			"Status":        blockStatus(d, n),
		}, nil
	}
	return nil, errNotFound(path)
}

func blockStatus(d api.Device, n api.Node) obj {
	if d.State != "" && d.State != "available" {
		return statusOf("Disabled", "Warning")
	}
	return nodeStatus(n)
}

func resourceBlock(d api.Device, v *view) obj {
	n, _ := v.node(d.NodeID)
	bp := blockPath(d.ID)
	var systems []string
	for _, l := range v.leases {
		for _, p := range l.Parts {
			if p.DeviceID == d.ID {
				systems = append(systems, systemPath(l.ID))
				break
			}
		}
	}
	shared := d.Sharing != "exclusive"
	o := obj{
		"@odata.id":         bp,
		"@odata.type":       typeOf("ResourceBlock"),
		"Id":                d.ID,
		"Name":              n.Name + "/" + d.Name,
		"Description":       fmt.Sprintf("%s device %s of node %s: capacity %d, allocated %d", d.Kind, d.Name, n.Name, d.Capacity, d.Allocated),
		"ResourceBlockType": []string{kindBlockType(d.Kind)},
		"Status":            blockStatus(d, n),
		"CompositionStatus": obj{
			"CompositionState": compositionState(d),
			"Reserved":         false,
			"SharingCapable":   shared,
			"SharingEnabled":   shared,
		},
		"Links": obj{
			"Chassis":         links([]string{pChassis + "/" + d.NodeID}),
			"ComputerSystems": links(systems),
			"Zones":           links(zonesOf(d.Kind)),
		},
	}
	switch d.Kind {
	case api.KindBlock:
		o["Drives"] = links([]string{bp + "/Drives/" + d.ID})
	case api.KindMemory:
		o["Memory"] = links([]string{bp + "/Memory/" + d.ID})
	case api.KindAccel:
		o["Processors"] = links([]string{bp + "/Processors/" + d.ID})
	}
	return o
}

func zonesOf(k api.Kind) []string {
	for _, z := range zoneKinds {
		if z == k {
			return []string{pZones + "/" + string(k)}
		}
	}
	return nil
}

func (s *Service) zoneCollection() obj {
	var ms []string
	for _, k := range zoneKinds {
		ms = append(ms, pZones+"/"+string(k))
	}
	return collection(pZones, "ZoneCollection", "Resource zones: one per device kind (a composed system is one kind)", ms)
}

func (s *Service) zone(ctx context.Context, c *caller, id string) (obj, error) {
	var kind api.Kind
	for _, k := range zoneKinds {
		if string(k) == id {
			kind = k
		}
	}
	if kind == "" {
		return nil, errNotFound(pZones + "/" + id)
	}
	v, err := s.load(ctx, c, false)
	if err != nil {
		return nil, err
	}
	var blocks []string
	for _, d := range v.devices {
		if d.Kind == kind {
			blocks = append(blocks, blockPath(d.ID))
		}
	}
	return obj{
		"@odata.id":   pZones + "/" + id,
		"@odata.type": typeOf("Zone"),
		"Id":          id,
		"Name":        "Zone of " + string(kind) + " devices",
		"Description": "Resource blocks of this zone can be composed together into one system (one Rialto lease).",
		"ZoneType":    "ZoneOfResourceBlocks",
		"Status":      statusOf("Enabled", "OK"),
		"Links":       obj{"ResourceBlocks": links(blocks)},
	}, nil
}

func eventService() obj {
	return obj{
		"@odata.id":          pEvents,
		"@odata.type":        typeOf("EventService"),
		"Id":                 "EventService",
		"Name":               "Rialto event service",
		"Description":        "The control plane's event stream as Server-Sent Events (Last-Event-ID resumes).",
		"ServiceEnabled":     true,
		"Status":             statusOf("Enabled", "OK"),
		"ServerSentEventUri": pEvents + "/SSE",
		"Subscriptions":      link(pEvents + "/Subscriptions"),
		"EventFormatTypes":   []string{"Event"},
	}
}

func (s *Service) sessionService() obj {
	return obj{
		"@odata.id":      "/redfish/v1/SessionService",
		"@odata.type":    typeOf("SessionService"),
		"Id":             "SessionService",
		"Name":           "Rialto session service",
		"Description":    "Log in with a Rialto API token as the password; the session's X-Auth-Token stands for it.",
		"ServiceEnabled": true,
		"SessionTimeout": int(s.cfg.SessionTimeout.Seconds()),
		"Status":         statusOf("Enabled", "OK"),
		"Sessions":       link(pSessions),
	}
}
