package redfish

import (
	"net/http"
	"strings"
)

// schemaVersions are the versioned namespaces of the schemas the service
// implements (every resource's @odata.type names one); nil entries are
// the unversioned collection schemas. docs/redfish.md lists them.
var schemaVersions = []struct{ name, version string }{
	{"ServiceRoot", "v1_20_0"},
	{"ComputerSystemCollection", ""},
	{"ComputerSystem", "v1_27_0"},
	{"ChassisCollection", ""},
	{"Chassis", "v1_28_0"},
	{"CompositionService", "v1_2_3"},
	{"ResourceBlockCollection", ""},
	{"ResourceBlock", "v1_4_3"},
	{"ZoneCollection", ""},
	{"Zone", "v1_6_3"},
	{"CompositionReservationCollection", ""},
	{"CompositionReservation", "v1_0_2"},
	{"DriveCollection", ""},
	{"Drive", "v1_22_0"},
	{"MemoryCollection", ""},
	{"Memory", "v1_23_0"},
	{"ProcessorCollection", ""},
	{"Processor", "v1_22_0"},
	{"StorageCollection", ""},
	{"Storage", "v1_21_0"},
	{"VolumeCollection", ""},
	{"Volume", "v1_10_2"},
	{"EventService", "v1_12_0"},
	{"EventDestinationCollection", ""},
	{"Event", "v1_13_0"},
	{"SessionService", "v1_2_0"},
	{"SessionCollection", ""},
	{"Session", "v1_8_0"},
	{"Message", "v1_3_0"},
	{"Manifest", "v1_1_2"},
	{"Resource", "v1_23_0"},
	{"RedfishExtensions", "v1_0_0"},
}

// typeOf returns the @odata.type of a resource of schema name.
func typeOf(name string) string {
	for _, s := range schemaVersions {
		if s.name == name {
			if s.version == "" {
				return "#" + name + "." + name
			}
			return "#" + name + "." + s.version + "." + name
		}
	}
	panic("redfish: no schema version for " + name)
}

// metadata is the service's CSDL document ($metadata): a reference to
// each DMTF schema it uses and the service's entity container.
var metadata = func() string {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	b.WriteString(`<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">` + "\n")
	for _, s := range schemaVersions {
		b.WriteString(`  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/` + s.name + `_v1.xml">` + "\n")
		if s.name == "RedfishExtensions" {
			b.WriteString(`    <edmx:Include Namespace="RedfishExtensions.` + s.version + `" Alias="Redfish"/>` + "\n")
		} else {
			b.WriteString(`    <edmx:Include Namespace="` + s.name + `"/>` + "\n")
			if s.version != "" {
				b.WriteString(`    <edmx:Include Namespace="` + s.name + `.` + s.version + `"/>` + "\n")
			}
		}
		b.WriteString("  </edmx:Reference>\n")
	}
	b.WriteString(`  <edmx:DataServices>` + "\n")
	b.WriteString(`    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">` + "\n")
	b.WriteString(`      <EntityContainer Name="Service" Extends="ServiceRoot.v1_20_0.ServiceContainer"/>` + "\n")
	b.WriteString("    </Schema>\n  </edmx:DataServices>\n</edmx:Edmx>\n")
	return b.String()
}()

func writeMetadata(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/xml")
	h.Set("OData-Version", "4.0")
	h.Set("Allow", "GET, HEAD")
	h.Set("ETag", etag([]byte(metadata)))
	if r.Method == http.MethodHead {
		return
	}
	w.Write([]byte(metadata))
}

// odataDocument is the OData service document (/redfish/v1/odata).
func odataDocument() obj {
	v := []obj{{"name": "Service", "kind": "Singleton", "url": "/redfish/v1/"}}
	for _, s := range []string{"Systems", "Chassis", "CompositionService", "EventService", "SessionService"} {
		v = append(v, obj{"name": s, "kind": "Singleton", "url": "/redfish/v1/" + s})
	}
	v = append(v, obj{"name": "Sessions", "kind": "Singleton", "url": "/redfish/v1/SessionService/Sessions"})
	return obj{"@odata.context": "/redfish/v1/$metadata", "value": v}
}
