package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress is the live progress line on stderr: on a terminal one line
// redrawn in place every half second, otherwise a line per step.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	tty     bool
	start   time.Time
	total   int // steps planned
	done    int
	current string // "round 1/3 · haproxy · keepalive"
	extra   string // finer detail ("change 3/20")
	stop    chan struct{}
	stopped chan struct{}
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, start: time.Now(), stop: make(chan struct{}), stopped: make(chan struct{})}
	if w == nil {
		p.w = io.Discard
		close(p.stopped)
		return p
	}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	if !p.tty {
		close(p.stopped)
		return p
	}
	go func() {
		defer close(p.stopped)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.mu.Lock()
				p.draw()
				p.mu.Unlock()
			}
		}
	}()
	return p
}

func (p *progress) plan(steps int) {
	p.mu.Lock()
	p.total = steps
	p.mu.Unlock()
}

// unplan takes n planned steps off (a mode skipped at start-up).
func (p *progress) unplan(n int) {
	p.mu.Lock()
	p.total -= n
	p.mu.Unlock()
}

// step starts a counted step.
func (p *progress) step(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.current != "" {
		p.done++
	}
	p.current, p.extra = s, ""
	p.emit()
}

// phase shows an uncounted activity (building, cleaning up).
func (p *progress) phase(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current, p.extra = s, ""
	p.emit()
}

// detail refines the current step without starting a new one.
func (p *progress) detail(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.extra = s
	if p.tty {
		p.draw()
	}
}

// logf prints a line of its own above the progress line.
func (p *progress) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
	fmt.Fprintf(p.w, "bench: "+format+"\n", args...)
	if p.tty {
		p.draw()
	}
}

func (p *progress) emit() {
	if p.tty {
		p.draw()
		return
	}
	fmt.Fprintf(p.w, "bench: %s\n", p.line())
}

func (p *progress) line() string {
	el := time.Since(p.start).Round(time.Second)
	s := fmt.Sprintf("[%s", el)
	if p.total > 0 {
		s += fmt.Sprintf(" %d/%d", min(p.done, p.total), p.total)
	}
	s += "] " + p.current
	if p.extra != "" {
		s += " · " + p.extra
	}
	return s
}

func (p *progress) draw() {
	line := p.line()
	if len(line) > 110 {
		line = line[:110]
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s", strings.TrimSpace(line))
}

// close ends the live line.
func (p *progress) close() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	<-p.stopped
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
}
