package kerneltest

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/svcproxy/svcproxy/lb"
)

// ScaleService is the i-th of many Services (i < 2^20): one ClusterIP
// (10.96.0.0/12), ten ready endpoints (10.128.0.0/10, ports 8080-8089).
func ScaleService(i int) lb.Service {
	e := make([]lb.Endpoint, 10)
	for j := range e {
		e[j] = lb.Endpoint{
			Addr:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>14), byte(i >> 6), byte(i&63<<2 | j&3)}), uint16(8080+j)),
			Ready: true, Serving: true,
		}
	}
	return lb.Service{
		Name:       lb.ServicePortName{Namespace: "scale", Name: fmt.Sprintf("svc-%05d", i)},
		Port:       80,
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})},
		Endpoints:  e,
	}
}

// ScaleServices returns ScaleService(0) to ScaleService(n-1).
func ScaleServices(n int) []lb.Service {
	svcs := make([]lb.Service, n)
	for i := range svcs {
		svcs[i] = ScaleService(i)
	}
	return svcs
}

// Median is the median of d (the upper one of an even count); d is not
// changed. It panics on an empty d.
func Median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// Ms formats d in milliseconds with one decimal: "12.3 ms".
func Ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
