package kube

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// RegisterRESTClientMetrics makes every request of the API client count in
// svcproxy_kube_rest_client_requests_total{code,method,host}, kube-proxy's
// rest_client_requests_total under svcproxy's name. It is how an API-server
// outage shows: informers retry a refused list or watch inside client-go
// without telling their owner, but each attempt lands here with code
// "<error>". client-go takes one registration per process; later calls do
// nothing.
func RegisterRESTClientMetrics(reg prometheus.Registerer) {
	restOnce.Do(func() {
		requests := prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "kube", Name: "rest_client_requests_total",
			Help: `Requests to the API server by HTTP status code ("<error>": no response, e.g. the server is unreachable), method and host.`,
		}, []string{"code", "method", "host"})
		reg.MustRegister(requests)
		clientmetrics.Register(clientmetrics.RegisterOpts{RequestResult: requestResult{requests}})
	})
}

var restOnce sync.Once

type requestResult struct{ c *prometheus.CounterVec }

func (r requestResult) Increment(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, host).Inc()
}
