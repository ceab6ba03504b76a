package ipvs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// The made file (Config.MadeFile) carries Mode.made across processes: on
// an address Config.ExcludeCIDRs protects, a virtual server is this
// svcproxy's to delete only if it made it, and a restart, a handover or a
// DaemonSet rollout would otherwise forget which those were and leave
// them behind once their Services go (as kube-proxy always does). Only
// the keys on excluded addresses are written: elsewhere the mode prunes
// whatever its Services do not ask for anyway. One line per virtual
// server, "tcp 192.0.2.7:30080"; the file is replaced whole (a temporary
// file renamed over it) after each sync that changed what it should hold.
//
// The file is read by each full sync (the first Apply is one) and by
// Cleanup, not by New: a mode built only to probe reads nothing. During a
// rollout two processes sync the same kernel and write the same file:
// each full sync reads it again and takes in what the other
// recorded, so what either made stays recorded (a record whose virtual
// server a full sync finds gone is dropped).

// madeHeader heads the made file.
const madeHeader = "# svcproxy IPVS mode: the virtual servers it made on addresses ipvs.excludeCIDRs protects (its to delete)\n"

// parseMade reads a made file's content; lines it cannot read are errors,
// the rest is kept.
func parseMade(data []byte) ([]vsKey, error) {
	var keys []vsKey
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		proto, addr, ok := strings.Cut(line, " ")
		if !ok {
			errs = append(errs, fmt.Errorf("line %d: %q: want <protocol> <address:port>", n, line))
			continue
		}
		p, err := lb.ParseProtocol(proto)
		if err != nil || proto == "" {
			errs = append(errs, fmt.Errorf("line %d: %q: unknown protocol", n, line))
			continue
		}
		ap, err := netip.ParseAddrPort(strings.TrimSpace(addr))
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		keys = append(keys, vsKey{proto: p, addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())})
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	return keys, errors.Join(errs...)
}

// formatMade is the made file's content for keys.
func formatMade(keys []vsKey) []byte {
	slices.SortFunc(keys, vsKey.Compare)
	var b bytes.Buffer
	b.WriteString(madeHeader)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %s\n", netfilter.ProtoName(k.proto), k.addr)
	}
	return b.Bytes()
}

// loadMade takes into m.made what Config.MadeFile, if there is one,
// records: the virtual servers on excluded addresses a previous svcproxy
// (or one running beside this one in a rollout) made. It remembers the
// file's content, to write it only when it should change.
func (m *Mode) loadMade() {
	if m.cfg.MadeFile == "" {
		return
	}
	data, err := os.ReadFile(m.cfg.MadeFile)
	if errors.Is(err, os.ErrNotExist) {
		m.madeSaved, m.madeFile = "", false
		return
	}
	if err != nil {
		if msg := err.Error(); msg != m.madeErr {
			m.log.Warn("cannot read which virtual servers on excluded addresses a previous svcproxy made; they stay once their Services go",
				zap.String("file", m.cfg.MadeFile), zap.Error(err))
			m.madeErr = msg
		}
		return
	}
	m.madeSaved, m.madeFile = string(data), true
	keys, err := parseMade(data)
	if err != nil && !m.madeWarned {
		m.log.Warn("skipping unreadable lines of the made file", zap.String("file", m.cfg.MadeFile), zap.Error(err))
		m.madeWarned = true
	}
	added := 0
	for _, k := range keys {
		if _, ok := m.made[k]; !ok && m.excluded(k.addr.Addr()) {
			m.madeIt(k)
			added++
		}
	}
	if added > 0 {
		m.log.Debug("virtual servers on excluded addresses another svcproxy made are this one's to delete",
			zap.String("file", m.cfg.MadeFile), zap.Int("added", added))
	}
}

// madeExcluded lists the made virtual servers on excluded addresses.
func (m *Mode) madeExcluded() []vsKey {
	var keys []vsKey
	for k := range m.made {
		if m.excluded(k.addr.Addr()) {
			keys = append(keys, k)
		}
	}
	return keys
}

// saveMade writes Config.MadeFile when what it should hold changed, and
// warns (once for the same failure) when it cannot.
func (m *Mode) saveMade() {
	if m.cfg.MadeFile == "" {
		return
	}
	keys := m.madeExcluded()
	if len(keys) == 0 && !m.madeFile {
		return // nothing to record, and no record to empty
	}
	data := formatMade(keys)
	if string(data) == m.madeSaved {
		return
	}
	err := writeFileAtomic(m.cfg.MadeFile, data)
	msg := ""
	if err != nil {
		msg = err.Error()
		if msg != m.madeErr {
			m.log.Warn("cannot record which virtual servers on excluded addresses this svcproxy made; after a restart they stay once their Services go",
				zap.String("file", m.cfg.MadeFile), zap.Error(err))
		}
	} else {
		m.madeSaved, m.madeFile = string(data), true
	}
	m.madeErr = msg
}

// writeFileAtomic replaces path with data: a reader sees the old content
// or the new, never a part.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
