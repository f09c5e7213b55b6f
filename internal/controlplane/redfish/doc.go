// Package redfish is Rialto's DMTF Redfish facade: a CompositionService
// under /redfish/v1 that data-center tools (the Redfish Service Validator,
// redfishtool, sushy, OpenStack) use to see the pool and to compose and
// decompose systems. Nodes are Chassis and physical Systems; lendable
// devices are ResourceBlocks grouped into ResourceZones by kind; a composed
// System is a Rialto lease: Specific composition (Links.ResourceBlocks)
// pins the lease to those devices, Constrained composition (capacities)
// lets placement choose; the Compose action's Preview is an explain,
// PreviewReserve a short-lived lease (a CompositionReservation) that Apply
// turns into a System; DELETE releases. EventService's SSE stream is the
// control plane's event stream. docs/redfish.md maps every resource.
//
// The facade holds no state of its own beyond login sessions and pending
// reservations (in memory): it calls the control plane's /v1 API with the
// caller's Rialto token (Basic auth's password, a session's token or a
// bearer token), in process through Config.API, so every tenant rule,
// quota and validation of /v1 applies unchanged.
//
// A Service is built by New; the zero value is not usable. It is safe for
// concurrent use. It starts no goroutine of its own: an SSE stream runs in
// its request's goroutine and ends with the request.
package redfish
