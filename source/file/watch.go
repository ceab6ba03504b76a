package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

// debounce is how long the services file's directory must stay quiet after
// a change before the file is reloaded, so an editor's write-and-rename is
// read once, whole.
const debounce = 100 * time.Millisecond

// Watcher makes Store hold exactly the Services of a services file, and
// reloads it on SIGHUP and whenever the file changes. Services the file
// gets wrong are logged and skipped; a file that cannot be read or parsed at
// all leaves the Store as it was. Do not copy a Watcher once used.
type Watcher struct {
	Path   string      // the services file; "" means Data
	Data   []byte      // the services file's content when Path is "" (the embedded default); never watched
	Store  *lb.Store   // required
	Logger *zap.Logger // nil: no logging

	// OnReload, if set, is called after every load, for metrics, with the
	// number of Service ports now in the Store and the load's error: nil,
	// the joined rejected services and Store conflicts, or why the file
	// could not be applied at all (the Store then keeps its previous state).
	// Loads are serialised, so it is never called concurrently; it must not
	// call Reload.
	OnReload func(services int, err error)

	mu   sync.Mutex // serialises loads
	last []byte     // the content last read, to skip change events that change nothing
}

// Run loads the services file, applies it, then reloads it on SIGHUP and on
// changes to the file (its directory is watched, so editors that replace the
// file by renaming work) until ctx is done, when it returns nil. It returns
// an error if the first load cannot be applied at all (see Reload) or the
// file cannot be watched; later failed reloads are logged and keep the
// previous Services.
func (w *Watcher) Run(ctx context.Context) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// Watch before the first load, so no change slips between the two.
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if w.Path != "" {
		fw, err := fsnotify.NewWatcher()
		if err != nil {
			return fmt.Errorf("watching %s: %w", w.Path, err)
		}
		defer fw.Close()
		if err := fw.Add(filepath.Dir(w.Path)); err != nil {
			return fmt.Errorf("watching %s: %w", w.Path, err)
		}
		events, watchErrs = fw.Events, fw.Errors
	}
	if err := w.Reload(); err != nil {
		return err
	}

	log := w.logger()
	timer := time.NewTimer(debounce)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			log.Info("reloading on SIGHUP")
			if err := w.Reload(); err != nil {
				log.Error("reloading services file; keeping the previous services", zap.Error(err))
			}
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			log.Debug("services file directory changed", zap.Stringer("event", ev))
			timer.Reset(debounce)
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			log.Warn("watching services file", zap.Error(err))
		case <-timer.C:
			if err := w.reload(false); err != nil {
				log.Error("reloading services file; keeping the previous services", zap.Error(err))
			}
		}
	}
}

// Reload reads the services file (or Data) and makes the Store hold exactly
// its Services. It returns an error only when nothing was applied because
// the file could not be read or is unusable as a whole (ErrInvalidFile); the
// Store then keeps its previous Services. Rejected services and Store
// conflicts are logged and passed to OnReload, not returned.
func (w *Watcher) Reload() error { return w.reload(true) }

// reload loads the file; unless force, only if its content changed since
// it was last read.
func (w *Watcher) reload(force bool) error {
	if w.Store == nil {
		return errors.New("file.Watcher: Store is nil")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	start := time.Now()
	log := w.logger()

	data, err := w.read()
	if err != nil {
		w.report(err)
		return err
	}
	if !force && w.last != nil && bytes.Equal(data, w.last) {
		log.Debug("services file unchanged")
		return nil
	}
	w.last = data

	services, parseErr := Parse(data)
	if errors.Is(parseErr, ErrInvalidFile) {
		err := fmt.Errorf("loading %s: %w", w.source(), parseErr)
		w.report(err)
		return err
	}
	forEach(parseErr, func(err error) { log.Warn("skipping service", zap.Error(err)) })
	snap, storeErr := w.Store.Replace(services)
	forEach(storeErr, func(err error) { log.Warn("service rejected by the store", zap.Error(err)) })
	log.Info("loaded services",
		zap.Int("services", snap.Len()),
		zap.Uint64("version", snap.Version),
		zap.Duration("duration", time.Since(start)))
	if err := errors.Join(parseErr, storeErr); err != nil {
		w.report(fmt.Errorf("loading %s: %w", w.source(), err))
	} else {
		w.report(nil)
	}
	return nil
}

func (w *Watcher) read() ([]byte, error) {
	if w.Path == "" {
		return w.Data, nil
	}
	data, err := os.ReadFile(w.Path)
	if err != nil {
		return nil, fmt.Errorf("reading services file: %w", err)
	}
	return data, nil
}

func (w *Watcher) report(err error) {
	if w.OnReload != nil {
		w.OnReload(w.Store.Snapshot().Len(), err)
	}
}

// source names where the services come from, for logs and errors.
func (w *Watcher) source() string {
	if w.Path == "" {
		return "embedded services file"
	}
	return w.Path
}

func (w *Watcher) logger() *zap.Logger {
	if w.Logger == nil {
		return zap.NewNop()
	}
	return w.Logger.Named("source.file").With(zap.String("file", w.source()))
}
