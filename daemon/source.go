package daemon

import (
	"context"
	"time"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/source/file"
	"github.com/svcproxy/svcproxy/source/kube"
)

// FileSource is the services file w, whose first load (w.Reload) has been
// done and counted in reloads: each reload is counted too, and one with a
// problem applies nothing. embedded says w serves the embedded example
// (logged, with w.Logger).
func FileSource(w *file.Watcher, reloads *ReloadMetrics, embedded bool) Source {
	return func(ctx context.Context, feed Feed) error {
		w.OnReload = func(services int, err error) {
			reloads.Loaded(err, time.Now())
			if err != nil { // nothing applied: the Services before stay
				feed.Rejected(services)
				return
			}
			feed.Loaded(services, nil)
		}
		feed.Loaded(w.Store.Snapshot().Len(), nil) // the first load
		if embedded && w.Logger != nil {
			w.Logger.Info("no --services given: serving the embedded example services file")
		}
		return w.Run(ctx)
	}
}

// KubeSource is the cluster's Services and EndpointSlices (kube.Run with
// opts) into store; the daemon supplies opts' Health, Changes and OnSync.
func KubeSource(opts kube.Options, store *lb.Store) Source {
	return func(ctx context.Context, feed Feed) error {
		opts.Health, opts.Changes, opts.OnSync = feed.Tracker, feed.Changes, feed.Loaded
		return kube.Run(ctx, opts, store)
	}
}
