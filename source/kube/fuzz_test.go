package kube

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/svcproxy/svcproxy/lb"
)

// FuzzConvert feeds arbitrary Services and EndpointSlices (as JSON, the
// API's own encoding) to Convert. Whatever comes in: no panic; every
// problem is an *InvalidError; every lb.Service passes Validate and the
// Store takes them all without a conflict; the result does not depend on
// the order of the slices. Seeds are in testdata/fuzz/FuzzConvert.
func FuzzConvert(f *testing.F) {
	f.Add([]byte(`{"metadata":{"namespace":"ns","name":"web"},"spec":{"type":"ClusterIP","clusterIP":"10.0.0.10","clusterIPs":["10.0.0.10"],"ports":[{"name":"http","protocol":"TCP","port":80}]}}`),
		[]byte(`{"metadata":{"namespace":"ns","name":"web-1","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],"endpoints":[{"addresses":["10.1.0.1"]}]}`),
		[]byte(`{"metadata":{"namespace":"ns","name":"web-2","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],"endpoints":[{"addresses":["10.1.0.1"],"nodeName":"node-a"}]}`))
	f.Fuzz(func(t *testing.T, svcJSON, slice1, slice2 []byte) {
		var svc v1.Service
		if json.Unmarshal(svcJSON, &svc) != nil {
			return
		}
		var eps []*discovery.EndpointSlice
		for _, data := range [][]byte{slice1, slice2} {
			var es discovery.EndpointSlice
			if json.Unmarshal(data, &es) == nil {
				eps = append(eps, &es)
			}
		}
		got, errs := Convert(&svc, eps, "", "node-a")
		for _, err := range errs {
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field == "" || inv.Reason == "" {
				t.Errorf("problem %v (%T) is not a complete *InvalidError", err, err)
			}
		}
		for i := range got {
			if err := got[i].Validate(); err != nil {
				t.Errorf("output %v fails Validate: %v", got[i].Name, err)
			}
		}
		if len(got) > 0 {
			if _, err := lb.NewStore(lb.StoreOptions{}).Replace(got); err != nil {
				t.Errorf("the Store rejects the output: %v", err)
			}
		}
		rev := slices.Clone(eps)
		slices.Reverse(rev)
		again, _ := Convert(&svc, rev, "", "node-a")
		if !reflect.DeepEqual(got, again) {
			t.Errorf("slice order changed the result:\n%+v\n%+v", got, again)
		}
	})
}
