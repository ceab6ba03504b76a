package model

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// rule is one iptables rule in the subset of the syntax svcproxy writes,
// parsed from iptables-restore input or iptables-save output. Anything else
// is kept in extra: such a rule round-trips, compares and can be deleted,
// but the tracer never matches it.
type rule struct {
	text       string // the specification as given
	opaque     bool   // text did not parse: kept verbatim, never matches
	src        netip.Prefix
	srcNeg     bool
	dst        netip.Prefix
	dstNeg     bool
	proto      string // "tcp", "udp", "sctp" or "" (any)
	dport      uint16
	mark       uint32
	markMask   uint32
	hasMark    bool
	markNeg    bool
	addrType   string // --dst-type, e.g. "LOCAL"
	addrNeg    bool
	srcType    string // --src-type
	srcTypeNeg bool
	ctstates   []string
	ctNeg      bool
	sets       []setMatch
	recent     *recentMatch
	// statistic --mode random: the probability in the kernel's units
	// (numerator over 2^31).
	hasStat  bool
	statProb uint32
	comment  string
	extra    []string // unrecognised tokens, in order

	target       string // -j: REDIRECT, REJECT, DNAT, MASQUERADE, MARK, RETURN, ACCEPT, DROP, a chain, or ""
	isGoto       bool   // -g: target is a chain, and its end returns to the chain that jumped here
	toPorts      string // REDIRECT and MASQUERADE --to-ports
	rejectWith   string // REJECT --reject-with
	toDest       string // DNAT --to-destination
	random       bool   // MASQUERADE/DNAT --random
	randomFully  bool   // MASQUERADE --random-fully
	hasXmark     bool   // MARK: mark = (mark &^ xmask) ^ xvalue
	xvalue       uint32 //
	xmask        uint32 //
	targetExtras []string
}

type setMatch struct {
	name  string
	flags string // "dst", "dst,dst", "dst,dst,src", ...
	neg   bool
}

// recentMatch is -m recent (xt_recent), which kube-proxy-style session
// affinity uses: a named list of source addresses with the time each was
// last seen.
type recentMatch struct {
	op      string // "--set", "--rcheck", "--update" or "--remove"
	neg     bool
	seconds uint32 // 0: any age
	reap    bool
	hits    uint32 // --hitcount
	rttl    bool
	name    string
	mask    netip.Addr // invalid: all ones of the rule's family
	rdest   bool       // --rdest: the destination address instead of the source
}

// conntrack states in the order libxt_conntrack prints them.
var ctStateOrder = []string{"INVALID", "NEW", "RELATED", "ESTABLISHED", "UNTRACKED", "SNAT", "DNAT"}

// String renders r as iptables-save does (without "-A CHAIN"): -s, -d, -p,
// then the matches, then -j and its options. Two rules that mean the same
// render the same, so String is also the comparison key. The matches come
// in a fixed order (tcp/udp/sctp, mark, addrtype, conntrack, set, recent,
// statistic, comment): iptables-save prints them in the order they were
// given, so rules written in this order read back unchanged.
func (r *rule) String() string {
	if r.opaque {
		return r.text
	}
	var b strings.Builder
	w := func(s ...string) {
		for _, x := range s {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(x)
		}
	}
	neg := func(n bool) {
		if n {
			w("!")
		}
	}
	if r.src.IsValid() {
		neg(r.srcNeg)
		w("-s", r.src.String())
	}
	if r.dst.IsValid() {
		neg(r.dstNeg)
		w("-d", r.dst.String())
	}
	if r.proto != "" {
		w("-p", r.proto)
	}
	if r.dport != 0 {
		w("-m", r.proto, "--dport", strconv.Itoa(int(r.dport)))
	}
	if r.hasMark {
		w("-m", "mark")
		neg(r.markNeg)
		if r.markMask == ^uint32(0) {
			w("--mark", fmt.Sprintf("%#x", r.mark))
		} else {
			w("--mark", fmt.Sprintf("%#x/%#x", r.mark, r.markMask))
		}
	}
	if r.srcType != "" || r.addrType != "" {
		w("-m", "addrtype")
		if r.srcType != "" {
			neg(r.srcTypeNeg)
			w("--src-type", r.srcType)
		}
		if r.addrType != "" {
			neg(r.addrNeg)
			w("--dst-type", r.addrType)
		}
	}
	if len(r.ctstates) > 0 {
		w("-m", "conntrack")
		neg(r.ctNeg)
		w("--ctstate", strings.Join(r.ctstates, ","))
	}
	for _, s := range r.sets {
		w("-m", "set")
		neg(s.neg)
		w("--match-set", s.name, s.flags)
	}
	if rc := r.recent; rc != nil {
		w("-m", "recent")
		neg(rc.neg)
		w(rc.op)
		if rc.seconds != 0 {
			w("--seconds", strconv.FormatUint(uint64(rc.seconds), 10))
		}
		if rc.reap {
			w("--reap")
		}
		if rc.hits != 0 {
			w("--hitcount", strconv.FormatUint(uint64(rc.hits), 10))
		}
		if rc.rttl {
			w("--rttl")
		}
		w("--name", rc.name)
		if rc.mask.IsValid() {
			w("--mask", rc.mask.String())
		}
		if rc.rdest {
			w("--rdest")
		} else {
			w("--rsource")
		}
	}
	if r.hasStat {
		w("-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.11f", float64(r.statProb)/(1<<31)))
	}
	if r.comment != "" {
		w("-m", "comment", "--comment", strconv.Quote(r.comment))
	}
	w(r.extra...)
	switch {
	case r.isGoto:
		w("-g", r.target)
	case r.target != "":
		w("-j", r.target)
	}
	if r.toDest != "" {
		w("--to-destination", r.toDest)
	}
	if r.toPorts != "" {
		w("--to-ports", r.toPorts)
	}
	if r.random {
		w("--random")
	}
	if r.randomFully {
		w("--random-fully")
	}
	if r.hasXmark {
		w("--set-xmark", fmt.Sprintf("%#x/%#x", r.xvalue, r.xmask))
	}
	if r.rejectWith != "" {
		w("--reject-with", r.rejectWith)
	}
	w(r.targetExtras...)
	return b.String()
}

// tokenize splits a rule the way a shell would for the quoting iptables-save
// uses: double quotes group, a backslash escapes the next character.
func tokenize(s string) ([]string, error) {
	var toks []string
	var cur strings.Builder
	inTok, inQuote := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inTok = true
		case c == '"':
			inQuote = !inQuote
			inTok = true
		case !inQuote && (c == ' ' || c == '\t'):
			if inTok {
				toks = append(toks, cur.String())
				cur.Reset()
				inTok = false
			}
		default:
			cur.WriteByte(c)
			inTok = true
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quote")
	}
	if inTok {
		toks = append(toks, cur.String())
	}
	return toks, nil
}

// parseRule parses a rule specification (what follows "-A CHAIN") of an
// iptables (IPv4) or ip6tables (IPv6) rule.
func parseRule(spec string, family Family) (*rule, error) {
	toks, err := tokenize(spec)
	if err != nil {
		return nil, err
	}
	r := &rule{text: spec}
	neg := false
	arg := func(i int) (string, error) {
		if i+1 >= len(toks) {
			return "", fmt.Errorf("%s needs an argument", toks[i])
		}
		return toks[i+1], nil
	}
	recent := func() *recentMatch {
		if r.recent == nil {
			r.recent = &recentMatch{name: "DEFAULT"}
		}
		return r.recent
	}
	inRecent, inStat := false, false
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t == "!" {
			neg = true
			continue
		}
		takeNeg := func() bool { n := neg; neg = false; return n }
		// value consumes the option's argument.
		value := func() (string, error) {
			v, err := arg(i)
			if err != nil {
				return "", err
			}
			i++
			return v, nil
		}
		switch t {
		case "-p", "--protocol":
			v, err := value()
			if err != nil {
				return nil, err
			}
			if takeNeg() {
				r.extra = append(r.extra, "!", t, v)
				continue
			}
			switch strings.ToLower(v) {
			case "tcp", "6":
				r.proto = "tcp"
			case "udp", "17":
				r.proto = "udp"
			case "sctp", "132":
				r.proto = "sctp"
			case "all", "0":
			default:
				r.extra = append(r.extra, t, v)
			}
		case "-d", "--destination", "--dst", "-s", "--source", "--src":
			v, err := value()
			if err != nil {
				return nil, err
			}
			p, err := parsePrefix(v)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", t, v, err)
			}
			if t == "-s" || t == "--source" || t == "--src" {
				r.src, r.srcNeg = p, takeNeg()
			} else {
				r.dst, r.dstNeg = p, takeNeg()
			}
		case "-m", "--match":
			v, err := value()
			if err != nil {
				return nil, err
			}
			inRecent, inStat = v == "recent", v == "statistic"
			switch v {
			case "tcp", "udp", "sctp", "mark", "addrtype", "conntrack", "set", "comment":
				// Options are recognised by name below.
			case "recent":
				if r.recent != nil {
					r.extra = append(r.extra, t, v)
					inRecent = false
				}
			case "statistic":
				if r.hasStat {
					r.extra = append(r.extra, t, v)
					inStat = false
				}
			default:
				r.extra = append(r.extra, t, v)
			}
		case "--dport", "--destination-port":
			v, err := value()
			if err != nil {
				return nil, err
			}
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 || takeNeg() {
				r.extra = append(r.extra, t, v)
				continue
			}
			r.dport = uint16(n)
		case "--mark":
			v, err := value()
			if err != nil {
				return nil, err
			}
			m, k, err := parseMarkMask(v, ^uint32(0))
			if err != nil {
				return nil, fmt.Errorf("--mark %s: %w", v, err)
			}
			r.hasMark, r.mark, r.markMask, r.markNeg = true, m, k, takeNeg()
		case "--dst-type":
			v, err := value()
			if err != nil {
				return nil, err
			}
			r.addrType, r.addrNeg = v, takeNeg()
		case "--src-type":
			v, err := value()
			if err != nil {
				return nil, err
			}
			r.srcType, r.srcTypeNeg = v, takeNeg()
		case "--ctstate":
			v, err := value()
			if err != nil {
				return nil, err
			}
			var states []string
			for _, s := range strings.Split(v, ",") {
				if !slices.Contains(ctStateOrder, s) {
					return nil, fmt.Errorf("bad ctstate %q", s)
				}
				states = append(states, s)
			}
			r.ctstates = nil
			for _, s := range ctStateOrder {
				if slices.Contains(states, s) {
					r.ctstates = append(r.ctstates, s)
				}
			}
			r.ctNeg = takeNeg()
		case "--match-set":
			if i+2 >= len(toks) {
				return nil, errors.New("--match-set needs a set name and flags")
			}
			r.sets = append(r.sets, setMatch{name: toks[i+1], flags: toks[i+2], neg: takeNeg()})
			i += 2
		case "--comment":
			v, err := value()
			if err != nil {
				return nil, err
			}
			r.comment = v
		case "--set", "--rcheck", "--update", "--remove":
			if !inRecent {
				r.extra = append(r.extra, t)
				continue
			}
			rc := recent()
			if rc.op != "" {
				return nil, fmt.Errorf("recent: option %q cannot be used together with %q", t, rc.op)
			}
			rc.op, rc.neg = t, takeNeg()
		case "--seconds", "--hitcount":
			if !inRecent {
				r.extra = append(r.extra, t)
				continue
			}
			v, err := value()
			if err != nil {
				return nil, err
			}
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("recent: bad %s %q", t, v)
			}
			if t == "--seconds" {
				recent().seconds = uint32(n)
			} else {
				recent().hits = uint32(n)
			}
		case "--reap", "--rttl", "--rsource", "--rdest":
			if !inRecent {
				r.extra = append(r.extra, t)
				continue
			}
			rc := recent()
			switch t {
			case "--reap":
				rc.reap = true
			case "--rttl":
				rc.rttl = true
			case "--rdest":
				rc.rdest = true
			case "--rsource":
				rc.rdest = false
			}
		case "--name":
			if !inRecent {
				r.extra = append(r.extra, t)
				continue
			}
			v, err := value()
			if err != nil {
				return nil, err
			}
			if v == "" || len(v) > 200 || strings.ContainsAny(v, "/") {
				return nil, fmt.Errorf("recent: bad --name %q", v)
			}
			recent().name = v
		case "--mask":
			if !inRecent {
				r.extra = append(r.extra, t)
				continue
			}
			v, err := value()
			if err != nil {
				return nil, err
			}
			a, err := netip.ParseAddr(v)
			if err != nil {
				return nil, fmt.Errorf("recent: bad --mask %q", v)
			}
			recent().mask = a
		case "--mode":
			if !inStat {
				r.extra = append(r.extra, t)
				continue
			}
			v, err := value()
			if err != nil {
				return nil, err
			}
			if v != "random" {
				r.extra = append(r.extra, "-m", "statistic", t, v)
				inStat = false
				continue
			}
			r.hasStat = true
		case "--probability":
			if !inStat {
				r.extra = append(r.extra, t)
				continue
			}
			v, err := value()
			if err != nil {
				return nil, err
			}
			p, err := strconv.ParseFloat(v, 64)
			if err != nil || p < 0 || p > 1 || takeNeg() {
				return nil, fmt.Errorf(`statistic: bad value for option "--probability", or out of range (0-1): %q`, v)
			}
			r.hasStat = true
			r.statProb = uint32(math.Round(p * (1 << 31)))
		case "-j", "--jump", "-g", "--goto":
			v, err := value()
			if err != nil {
				return nil, err
			}
			r.target, r.isGoto = v, t == "-g" || t == "--goto"
		case "--to-ports", "--to-port":
			v, err := value()
			if err != nil {
				return nil, err
			}
			r.toPorts = v
		case "--to-destination":
			v, err := value()
			if err != nil {
				return nil, err
			}
			if _, _, err := parseNATDest(v, family); err != nil {
				return nil, err
			}
			r.toDest = v
		case "--random":
			r.random = true
		case "--random-fully":
			r.randomFully = true
		case "--reject-with":
			v, err := value()
			if err != nil {
				return nil, err
			}
			r.rejectWith = v
		case "--set-xmark", "--set-mark", "--or-mark", "--and-mark", "--xor-mark":
			if r.target != "MARK" {
				r.extra = append(r.extra, t)
				continue
			}
			v, err := value()
			if err != nil {
				return nil, err
			}
			if r.hasXmark {
				return nil, errors.New("MARK: only one mark operation")
			}
			r.hasXmark = true
			switch t {
			case "--set-xmark":
				r.xvalue, r.xmask, err = parseMarkMask(v, ^uint32(0))
			case "--set-mark":
				r.xvalue, r.xmask, err = parseMarkMask(v, ^uint32(0))
			case "--or-mark":
				r.xvalue, err = parseMark(v)
				r.xmask = r.xvalue
			case "--and-mark":
				var m uint32
				m, err = parseMark(v)
				r.xvalue, r.xmask = 0, ^m
			case "--xor-mark":
				r.xvalue, err = parseMark(v)
				r.xmask = 0
			}
			if err != nil {
				return nil, fmt.Errorf("MARK %s %s: %w", t, v, err)
			}
		default:
			if takeNeg() {
				r.extra = append(r.extra, "!")
			}
			if r.target != "" {
				r.targetExtras = append(r.targetExtras, t)
			} else {
				r.extra = append(r.extra, t)
			}
		}
	}
	if neg {
		return nil, errors.New("dangling !")
	}
	if r.dport != 0 && r.proto == "" {
		return nil, errors.New("--dport needs -p tcp, -p udp or -p sctp")
	}
	if rc := r.recent; rc != nil {
		if rc.op == "" {
			rc.op = "--set"
		}
		if rc.reap && rc.seconds == 0 {
			return nil, errors.New(`recent: option "--reap" also requires "--seconds"`)
		}
		if !rc.mask.IsValid() {
			rc.mask = allOnes(family)
		}
	}
	if r.target == "MARK" && !r.hasXmark {
		return nil, errors.New("MARK target: one of --set-xmark, --set-mark, --or-mark, --and-mark, --xor-mark is required")
	}
	return r, nil
}

func allOnes(f Family) netip.Addr {
	if f == IPv6 {
		b := [16]byte{}
		for i := range b {
			b[i] = 0xff
		}
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

func parseMark(v string) (uint32, error) {
	n, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		return 0, errors.New("not a mark")
	}
	return uint32(n), nil
}

// parseMarkMask parses value[/mask]; a missing mask is def.
func parseMarkMask(v string, def uint32) (uint32, uint32, error) {
	val, mask, hasMask := strings.Cut(v, "/")
	m, err := parseMark(val)
	if err != nil {
		return 0, 0, err
	}
	k := def
	if hasMask {
		if k, err = parseMark(mask); err != nil {
			return 0, 0, err
		}
	}
	return m, k, nil
}

// parseNATDest parses a DNAT --to-destination of one address with an
// optional port: "10.0.0.1", "10.0.0.1:80", "[fd00::1]:80", "fd00::1".
func parseNATDest(v string, family Family) (netip.Addr, uint16, error) {
	var a netip.Addr
	var port uint16
	if ap, err := netip.ParseAddrPort(v); err == nil {
		a, port = ap.Addr(), ap.Port()
		if port == 0 {
			return netip.Addr{}, 0, fmt.Errorf("bad port in --to-destination %q", v)
		}
	} else if a, err = netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(v, "["), "]")); err != nil {
		return netip.Addr{}, 0, fmt.Errorf("--to-destination %q: invalid address format", v)
	}
	if a.Zone() != "" || a.Is4() != (family == IPv4) || a.Is4In6() {
		return netip.Addr{}, 0, fmt.Errorf("--to-destination %q: invalid address format", v)
	}
	return a, port, nil
}

// opaqueRule keeps a rule svcproxy cannot parse verbatim, with its target
// if one can be found.
func opaqueRule(spec string) *rule {
	r := &rule{text: spec, opaque: true}
	f := strings.Fields(spec)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "--jump" || f[i] == "-g" || f[i] == "--goto" {
			r.target = f[i+1]
		}
	}
	return r
}

// parsePrefix parses an address or prefix as iptables does: a bare address
// is a host prefix.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
