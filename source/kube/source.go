package kube

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/svcproxy/svcproxy/lb"
)

const (
	kindService = "Service"
	kindSlice   = "EndpointSlice"
	kindNode    = "Node"

	byServiceIndex = "service" // EndpointSlices by "namespace/service-name"

	// maxLoggedProblems bounds the problems logged for one object at once
	// (a slice of 10,000 bad endpoints logs a few and a count).
	maxLoggedProblems = 5
)

// NodeHealth is what Run tells the /healthz tracker (health.Tracker
// implements it): that a change is queued, and whether the node is eligible
// in kube-proxy's sense (not being deleted, not tainted
// ToBeDeletedByClusterAutoscaler).
type NodeHealth interface {
	Queued()
	SetNodeEligible(eligible bool)
}

// TaintToBeDeleted is the cluster autoscaler's taint on a node it is about
// to delete; kube-proxy's /healthz fails on such a node.
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// AnnotationLastChangeTriggerTime on an EndpointSlice is when the change it
// carries was triggered (a Pod or the Service changing), set by the
// EndpointSlice controller: network programming latency starts there.
const AnnotationLastChangeTriggerTime = v1.EndpointsLastChangeTriggerTime

// ChangeTracker follows each change from its arrival to the sync that
// programs it (runner.Changes implements it). Received is called for each
// Service or EndpointSlice event that may change what is served, with when
// it was triggered (zero: unknown); Cut when a write takes the changes
// received so far; Written with the Store version that write published (0:
// none).
type ChangeTracker interface {
	Received(endpoints bool, service string, triggered time.Time)
	Cut()
	Written(version uint64)
}

// Options configure Run.
type Options struct {
	Client   kubernetes.Interface // required
	NodeName string               // required: this node (--hostname-override); its Node is watched and its endpoints are local
	// Zone, if set, is this node's zone for topology hints, fixed (--zone).
	// Empty: the zone follows the Node's topology.kubernetes.io/zone label
	// live, as kube-proxy's does: a change sets the Store's node zone
	// (lb.Store.SetNode), which decides the hinted Services again.
	Zone string

	// ProxyName, if set, makes svcproxy serve only the Services labelled
	// service.kubernetes.io/service-proxy-name=ProxyName; empty (the
	// default) serves exactly the Services without that label.
	ProxyName string

	// ResyncPeriod is the informers' resync period; zero: none (changes
	// arrive by watch; a resync would only re-deliver the same objects).
	ResyncPeriod time.Duration

	Logger  *zap.Logger   // nil: no logging
	Metrics *Metrics      // nil: none
	Health  NodeHealth    // nil: none
	Changes ChangeTracker // nil: changes are not followed

	// OnSync, if set, is called after every write into the Store with the
	// number of Service ports the source has written and the write's
	// problems (invalid objects and Store conflicts), for metrics. Writes
	// are serialised.
	OnSync func(servicePorts int, err error)
	// OnNode, if set, is called with this node's Node whenever it is added
	// or changes (zone label, proxy-mode annotation, deletion), after a
	// zone change reached the Store.
	OnNode func(node *v1.Node)
}

// Run feeds store from the API server until ctx ends, then returns nil. It
// waits for the informers' first list (logging while the API server is
// unreachable), writes every Service with Store.Replace, then writes the
// changed ones with Store.Update as they arrive: changes arriving during a
// write go together in the next (the sync runner coalesces the snapshots
// it applies, --min-sync-period). After a
// watch error, the first write once the watch is back is a full Replace,
// so anything deleted meanwhile is removed. Invalid objects are logged and
// counted, never fatal. It returns an error only for unusable Options.
func Run(ctx context.Context, opts Options, store *lb.Store) error {
	s, err := newSource(opts, store)
	if err != nil {
		return err
	}
	return s.run(ctx)
}

type source struct {
	opts  Options
	store *lb.Store
	log   *zap.Logger

	factories     []informers.SharedInformerFactory
	services      cache.SharedIndexInformer
	endpointSlice cache.SharedIndexInformer
	nodes         cache.SharedIndexInformer

	kick chan struct{}

	mu       sync.Mutex
	dirty    map[string]struct{} // "namespace/name" of Services to recompute
	needFull bool                // a watch failed: the next write is a full Replace

	// Owned by the flush loop.
	written   map[string][]lb.Service // per Service, what the Store was given
	ports     int
	conflicts map[string]bool // Store conflicts already logged
}

func newSource(opts Options, store *lb.Store) (*source, error) {
	if opts.Client == nil {
		return nil, errors.New("kube: Options.Client is nil")
	}
	if opts.NodeName == "" {
		return nil, errors.New("kube: Options.NodeName is empty")
	}
	if store == nil {
		return nil, errors.New("kube: store is nil")
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	s := &source{
		opts:      opts,
		store:     store,
		log:       log.Named("source.kube"),
		kick:      make(chan struct{}, 1),
		dirty:     map[string]struct{}{},
		written:   map[string][]lb.Service{},
		conflicts: map[string]bool{},
	}

	svcSelector := "!" + LabelServiceProxyName
	if opts.ProxyName != "" {
		svcSelector = LabelServiceProxyName + "=" + opts.ProxyName
	}
	// Slices are selected by their Service's name only: whoever wrote them
	// (the EndpointSlice controller copies Service labels, other writers
	// may not), Convert matches them to the Services that are served.
	sliceSelector := discovery.LabelServiceName + ",!" + LabelHeadless
	strip := informers.WithTransform(stripManagedFields)
	newFactory := func(tweak func(*metav1.ListOptions)) informers.SharedInformerFactory {
		f := informers.NewSharedInformerFactoryWithOptions(opts.Client, opts.ResyncPeriod, strip, informers.WithTweakListOptions(tweak))
		s.factories = append(s.factories, f)
		return f
	}
	s.services = newFactory(func(o *metav1.ListOptions) { o.LabelSelector = svcSelector }).Core().V1().Services().Informer()
	s.endpointSlice = newFactory(func(o *metav1.ListOptions) { o.LabelSelector = sliceSelector }).Discovery().V1().EndpointSlices().Informer()
	s.nodes = newFactory(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + opts.NodeName }).Core().V1().Nodes().Informer()

	if err := s.endpointSlice.AddIndexers(cache.Indexers{byServiceIndex: sliceServiceKey}); err != nil {
		return nil, fmt.Errorf("kube: indexing EndpointSlices: %w", err)
	}
	for _, w := range []struct {
		kind string
		inf  cache.SharedIndexInformer
		key  func(obj any) (string, bool)
	}{
		{kindService, s.services, serviceKey},
		{kindSlice, s.endpointSlice, sliceKey},
	} {
		if _, err := w.inf.AddEventHandler(s.handler(w.kind, w.key)); err != nil {
			return nil, fmt.Errorf("kube: watching %ss: %w", w.kind, err)
		}
	}
	if _, err := s.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.event(kindNode, "add"); s.node(obj, false) },
		UpdateFunc: func(_, obj any) { s.event(kindNode, "update"); s.node(obj, false) },
		DeleteFunc: func(obj any) { s.event(kindNode, "delete"); s.node(obj, true) },
	}); err != nil {
		return nil, fmt.Errorf("kube: watching the Node: %w", err)
	}
	for kind, inf := range map[string]cache.SharedIndexInformer{kindService: s.services, kindSlice: s.endpointSlice, kindNode: s.nodes} {
		if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) { s.watchError(kind, err) }); err != nil {
			return nil, fmt.Errorf("kube: watching %ss: %w", kind, err)
		}
	}
	return s, nil
}

// stripManagedFields drops what svcproxy never reads before objects are
// cached: at 10,000 Services managedFields are most of the memory.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
		m.GetObjectMeta().SetManagedFields(nil)
	}
	return obj, nil
}

func serviceKey(obj any) (string, bool) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return key, err == nil
}

func sliceKey(obj any) (string, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	es, ok := obj.(*discovery.EndpointSlice)
	if !ok || es.Labels[discovery.LabelServiceName] == "" {
		return "", false
	}
	return es.Namespace + "/" + es.Labels[discovery.LabelServiceName], true
}

func sliceServiceKey(obj any) ([]string, error) {
	key, ok := sliceKey(obj)
	if !ok {
		return nil, nil
	}
	return []string{key}, nil
}

func (s *source) handler(kind string, key func(any) (string, bool)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			s.event(kind, "add")
			if k, ok := key(obj); ok {
				s.markDirty(k, kind, triggerTime(obj, true))
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			s.event(kind, "update")
			o, _ := oldObj.(metav1.Object)
			n, _ := obj.(metav1.Object)
			if o != nil && n != nil && o.GetResourceVersion() == n.GetResourceVersion() {
				// A resync or relist re-delivering what we have: nothing
				// changed, but after a watch error it is the sign the
				// watch is back, which the pending full write waits for.
				s.mu.Lock()
				full := s.needFull
				s.mu.Unlock()
				if full {
					s.trigger()
				}
				return
			}
			k, ok := key(obj)
			if oldKey, oldOK := key(oldObj); oldOK && (!ok || oldKey != k) {
				s.markDirty(oldKey, "", time.Time{}) // a slice relabelled to another Service leaves the old one
			}
			if ok {
				s.markDirty(k, kind, triggerTime(obj, false))
			}
		},
		DeleteFunc: func(obj any) {
			s.event(kind, "delete")
			// A deleted slice's trigger time is its last update's, not
			// the deletion's: kube-proxy ignores it, and so do we.
			if k, ok := key(obj); ok {
				s.markDirty(k, kind, time.Time{})
			}
		},
	}
}

func (s *source) event(kind, ev string) {
	if m := s.opts.Metrics; m != nil {
		m.events.WithLabelValues(kind, ev).Inc()
	}
}

// triggerTime is when the change obj carries was triggered in the cluster:
// an EndpointSlice's last-change-trigger-time annotation, or a Service's
// creation when it is added (a Service's other changes carry no time of
// their own); zero when unknown.
func triggerTime(obj any, added bool) time.Time {
	switch o := obj.(type) {
	case *discovery.EndpointSlice:
		v, ok := o.Annotations[AnnotationLastChangeTriggerTime]
		if !ok {
			return time.Time{}
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return time.Time{}
		}
		return t
	case *v1.Service:
		if added {
			return o.CreationTimestamp.Time
		}
	}
	return time.Time{}
}

// markDirty queues key's Service for the next write; kind ("" for none)
// names the change to follow, with when it was triggered.
func (s *source) markDirty(key, kind string, triggered time.Time) {
	s.mu.Lock()
	s.dirty[key] = struct{}{}
	n := len(s.dirty)
	if c := s.opts.Changes; c != nil && kind != "" {
		// Under s.mu, so the change lands in the Cut that takes key.
		c.Received(kind == kindSlice, key, triggered)
	}
	s.mu.Unlock()
	if m := s.opts.Metrics; m != nil {
		m.pending.Set(float64(n))
	}
	if s.opts.Health != nil {
		s.opts.Health.Queued()
	}
	s.trigger()
}

func (s *source) trigger() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *source) watchError(kind string, err error) {
	if m := s.opts.Metrics; m != nil {
		m.watchErrors.WithLabelValues(kind).Inc()
	}
	s.mu.Lock()
	s.needFull = true
	s.mu.Unlock()
	s.log.Warn("watching the API server failed; keeping the last state and retrying", zap.String("kind", kind), zap.Error(err))
}

func (s *source) node(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	eligible := NodeEligible(node) && !deleted
	if !eligible {
		s.log.Warn("this node is being deleted: /healthz reports it not eligible", zap.String("node", node.Name))
	}
	if s.opts.Health != nil {
		s.opts.Health.SetNodeEligible(eligible)
	}
	if !deleted {
		s.followZone(node)
	}
	if s.opts.OnNode != nil && !deleted {
		s.opts.OnNode(node)
	}
}

// followZone gives the Store the Node's zone label when it differs from
// the Store's, unless Options.Zone fixes the zone. A deleted Node keeps
// the last zone.
func (s *source) followZone(node *v1.Node) {
	if s.opts.Zone != "" {
		return
	}
	n := s.store.Node()
	zone := Zone(node)
	if zone == n.Zone {
		return
	}
	start := time.Now()
	old := n.Zone
	n.Zone = zone
	// Its only errors are frontend conflicts, which a zone does not
	// change: the writes that made them report them.
	snap, _ := s.store.SetNode(n)
	s.log.Info("this node's zone changed: topology hints decided again", zap.String("node", node.Name),
		zap.String("from", old), zap.String("to", zone), zap.Uint64("version", snap.Version), zap.Duration("duration", time.Since(start)))
}

// NodeEligible is kube-proxy's eligibility: the node is not being deleted
// and not tainted for deletion by the cluster autoscaler.
func NodeEligible(node *v1.Node) bool {
	if node.DeletionTimestamp != nil {
		return false
	}
	for _, t := range node.Spec.Taints {
		if t.Key == TaintToBeDeleted {
			return false
		}
	}
	return true
}

func (s *source) run(ctx context.Context) error {
	for _, f := range s.factories {
		f.Start(ctx.Done())
	}
	defer func() {
		for _, f := range s.factories {
			f.Shutdown()
		}
	}()

	start := time.Now()
	s.log.Info("waiting for the first list of Services and EndpointSlices", zap.String("node", s.opts.NodeName))
	synced := make(chan bool, 1)
	go func() { synced <- cache.WaitForCacheSync(ctx.Done(), s.services.HasSynced, s.endpointSlice.HasSynced) }()
	tick := time.NewTicker(10 * time.Second)
	for waiting := true; waiting; {
		select {
		case ok := <-synced:
			if !ok {
				tick.Stop()
				return nil
			}
			waiting = false
		case <-tick.C:
			s.log.Warn("still waiting for the API server", zap.Duration("waited", time.Since(start).Round(time.Second)))
		}
	}
	tick.Stop()
	s.log.Info("informers synced", zap.Duration("duration", time.Since(start)))

	s.mu.Lock()
	s.needFull = true
	s.mu.Unlock()
	s.flush()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		}
		s.flush()
	}
}

// flush writes the dirty Services (or, when a full write is due, all of
// them) into the Store.
func (s *source) flush() {
	s.mu.Lock()
	dirty, full := s.dirty, s.needFull
	s.dirty, s.needFull = map[string]struct{}{}, false
	if c := s.opts.Changes; c != nil && (len(dirty) > 0 || full) {
		c.Cut() // every change received is in dirty: they go together
	}
	s.mu.Unlock()
	if m := s.opts.Metrics; m != nil {
		m.pending.Set(0)
	}
	if len(dirty) == 0 && !full {
		return
	}
	start := time.Now()
	kind := "partial"
	var problems []error
	var storeErr error
	var snap *lb.Snapshot
	if full {
		kind = "full"
		all := map[string][]lb.Service{}
		var flat []lb.Service
		for _, obj := range s.services.GetStore().List() {
			svc, ok := obj.(*v1.Service)
			if !ok {
				continue
			}
			key := svc.Namespace + "/" + svc.Name
			ports, errs := s.convert(key, svc)
			problems = append(problems, errs...)
			if len(ports) > 0 {
				all[key] = ports
				flat = append(flat, ports...)
			}
		}
		s.written = all
		s.ports = len(flat)
		snap, storeErr = s.store.Replace(flat)
	} else {
		var upserts []lb.Service
		var deletes []lb.ServicePortName
		for key := range dirty {
			var ports []lb.Service
			obj, exists, _ := s.services.GetStore().GetByKey(key)
			if svc, ok := obj.(*v1.Service); exists && ok {
				var errs []error
				ports, errs = s.convert(key, svc)
				problems = append(problems, errs...)
			}
			prev := s.written[key]
			if reflect.DeepEqual(prev, ports) {
				continue
			}
			for _, p := range prev {
				if !slices.ContainsFunc(ports, func(q lb.Service) bool { return q.Name == p.Name }) {
					deletes = append(deletes, p.Name)
				}
			}
			upserts = append(upserts, ports...)
			s.ports += len(ports) - len(prev)
			if len(ports) > 0 {
				s.written[key] = ports
			} else {
				delete(s.written, key)
			}
		}
		if len(upserts)+len(deletes) > 0 {
			snap, storeErr = s.store.Update(upserts, deletes)
		}
	}
	end := time.Now()
	took := end.Sub(start)
	if c := s.opts.Changes; c != nil {
		var version uint64
		if snap != nil {
			version = snap.Version
		}
		c.Written(version)
	}
	s.reportStoreErrors(storeErr)

	if m := s.opts.Metrics; m != nil {
		m.flushes.WithLabelValues(kind).Inc()
		m.flushDuration.WithLabelValues(kind).Observe(took.Seconds())
		m.servicePorts.Set(float64(s.ports))
		m.lastFlush.Set(float64(end.UnixNano()) / 1e9)
	}
	if snap != nil {
		log := s.log.Debug
		if full || took > time.Second {
			log = s.log.Info
		}
		log("wrote Services into the store", zap.String("type", kind), zap.Int("changedServices", len(dirty)),
			zap.Int("servicePorts", s.ports), zap.Uint64("version", snap.Version), zap.Duration("duration", took))
	}
	if s.opts.OnSync != nil {
		s.opts.OnSync(s.ports, errors.Join(append(problems, storeErr)...))
	}
}

// convert converts one Service with its slices and reports its problems
// (logged, counted by kind).
func (s *source) convert(key string, svc *v1.Service) ([]lb.Service, []error) {
	objs, _ := s.endpointSlice.GetIndexer().ByIndex(byServiceIndex, key)
	eps := make([]*discovery.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if es, ok := o.(*discovery.EndpointSlice); ok {
			eps = append(eps, es)
		}
	}
	ports, errs := Convert(svc, eps, s.opts.ProxyName, s.opts.NodeName)
	s.report(svc, errs)
	return ports, errs
}

// report logs one conversion's problems, a few per object, and counts each
// object with problems once.
func (s *source) report(svc *v1.Service, errs []error) {
	if len(errs) == 0 {
		return
	}
	type obj struct{ kind, name string }
	per := map[obj][]string{}
	var order []obj
	for _, err := range errs {
		var inv *InvalidError
		if !errors.As(err, &inv) {
			continue
		}
		o := obj{inv.Kind, inv.Namespace + "/" + inv.Name}
		if _, seen := per[o]; !seen {
			order = append(order, o)
		}
		per[o] = append(per[o], inv.Field+": "+inv.Reason)
	}
	for _, o := range order {
		msgs := per[o]
		if m := s.opts.Metrics; m != nil {
			m.invalid.WithLabelValues(o.kind).Inc()
		}
		fields := []zap.Field{zap.String("kind", o.kind), zap.String("object", o.name),
			zap.String("service", svc.Namespace+"/"+svc.Name), zap.Int("problems", len(msgs))}
		if len(msgs) > maxLoggedProblems {
			fields = append(fields, zap.Strings("first", msgs[:maxLoggedProblems]))
		} else {
			fields = append(fields, zap.Strings("details", msgs))
		}
		s.log.Warn("invalid object: the invalid parts are ignored", fields...)
	}
}

// reportStoreErrors logs each Store conflict once (they repeat on every
// write while they last).
func (s *source) reportStoreErrors(err error) {
	now := map[string]bool{}
	var each func(error)
	each = func(err error) {
		if err == nil {
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				each(e)
			}
			return
		}
		msg := err.Error()
		now[msg] = true
		if !s.conflicts[msg] {
			s.log.Warn("the store rejected part of a Service", zap.Error(err))
			if m := s.opts.Metrics; m != nil {
				m.invalid.WithLabelValues(kindService).Inc()
			}
		}
	}
	each(err)
	s.conflicts = now
}
