package model

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The ipset types the model knows.
const (
	SetIP       = "hash:ip"
	SetIPPort   = "hash:ip,port"
	SetIPPortIP = "hash:ip,port,ip"
	SetNet      = "hash:net"
	SetPort     = "bitmap:port"
)

// aliases kept short inside the package.
const (
	typeIP       = SetIP
	typeIPPort   = SetIPPort
	typeIPPortIP = SetIPPortIP
	typeNet      = SetNet
	typePort     = SetPort
)

// ipset is one set as a Kernel keeps it.
type ipset struct {
	typ     string
	family  string // inet or inet6 (hash types)
	lo, hi  int    // bitmap:port range
	maxelem int
	members map[string]struct{}
}

func (s *ipset) compatible(o *ipset) bool {
	return s.typ == o.typ && s.family == o.family
}

func (s *ipset) sameParams(o *ipset) bool {
	return s.compatible(o) && s.lo == o.lo && s.hi == o.hi && s.maxelem == o.maxelem
}

// parseCreate parses the options after "create NAME".
func parseCreate(args []string) (*ipset, error) {
	if len(args) == 0 {
		return nil, errors.New("create needs a type")
	}
	s := &ipset{typ: args[0], maxelem: 65536, members: map[string]struct{}{}}
	switch s.typ {
	case typeIP, typeIPPort, typeIPPortIP, typeNet:
		s.family = "inet"
	case typePort:
		s.lo = -1
	default:
		return nil, fmt.Errorf("unsupported set type %q", s.typ)
	}
	for i := 1; i < len(args); i++ {
		if i+1 >= len(args) {
			return nil, fmt.Errorf("option %s needs a value", args[i])
		}
		k, v := args[i], args[i+1]
		i++
		switch {
		case k == "family" && s.typ != typePort && (v == "inet" || v == "inet6"):
			s.family = v
		case (k == "hashsize" || k == "bucketsize") && s.typ != typePort:
			if _, err := strconv.ParseUint(v, 10, 32); err != nil {
				return nil, fmt.Errorf("bad %s %q", k, v)
			}
		case k == "initval" && s.typ != typePort:
		case k == "maxelem" && s.typ != typePort:
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("bad maxelem %q", v)
			}
			s.maxelem = n
		case k == "range" && s.typ == typePort:
			lo, hi, err := parsePortRange(v)
			if err != nil {
				return nil, err
			}
			s.lo, s.hi = lo, hi
		default:
			return nil, fmt.Errorf("unsupported option %s %s for %s", k, v, s.typ)
		}
	}
	if s.typ == typePort && s.lo < 0 {
		return nil, errors.New("bitmap:port needs a range")
	}
	return s, nil
}

func parsePortRange(v string) (int, int, error) {
	a, b, ok := strings.Cut(v, "-")
	lo, err1 := strconv.ParseUint(a, 10, 16)
	hi, err2 := lo, error(nil)
	if ok {
		hi, err2 = strconv.ParseUint(b, 10, 16)
	}
	if err1 != nil || err2 != nil || hi < lo {
		return 0, 0, fmt.Errorf("bad port range %q", v)
	}
	return int(lo), int(hi), nil
}

// canon returns the members m stands for in s, in ipset's printed form.
func (s *ipset) canon(m string) ([]string, error) {
	switch s.typ {
	case typePort:
		lo, hi, err := parsePortRange(m)
		if err != nil {
			return nil, err
		}
		if lo < s.lo || hi > s.hi {
			return nil, fmt.Errorf("port %s is outside the set range %d-%d", m, s.lo, s.hi)
		}
		out := make([]string, 0, hi-lo+1)
		for p := lo; p <= hi; p++ {
			out = append(out, strconv.Itoa(p))
		}
		return out, nil
	case typeIP:
		return s.canonIP(m)
	case typeNet:
		p, err := parsePrefix(m)
		if err != nil {
			return nil, fmt.Errorf("bad net %q: %w", m, err)
		}
		if p.Addr().Is4() != (s.family == "inet") {
			return nil, fmt.Errorf("%s is not of family %s", m, s.family)
		}
		if p.Bits() == 0 {
			return nil, errors.New("hash:net cannot store a /0")
		}
		if p.IsSingleIP() {
			return []string{p.Addr().String()}, nil
		}
		return []string{p.String()}, nil
	}
	ipPart, pp, ok := strings.Cut(m, ",")
	if !ok {
		return nil, fmt.Errorf("bad ip,port %q", m)
	}
	third := ""
	if s.typ == typeIPPortIP {
		pp, third, ok = strings.Cut(pp, ",")
		if !ok {
			return nil, fmt.Errorf("third element is missing from %q", m)
		}
		ip3, err := netip.ParseAddr(third)
		if err != nil || ip3.Zone() != "" || ip3.Is4() != (s.family == "inet") {
			return nil, fmt.Errorf("bad third ip in %q (a plain %s address)", m, s.family)
		}
		third = "," + ip3.String()
	}
	ip, err := netip.ParseAddr(ipPart)
	if err != nil || ip.Zone() != "" {
		return nil, fmt.Errorf("bad ip in %q", m)
	}
	if ip.Is4() != (s.family == "inet") {
		return nil, fmt.Errorf("%s is not of family %s", ip, s.family)
	}
	proto, port, ok := strings.Cut(pp, ":")
	if !ok {
		proto, port = "tcp", pp
	}
	proto = strings.ToLower(proto)
	if name, ok := protoNumbers[proto]; ok {
		proto = name // ipset takes numbers too and prints names
	}
	if proto != "tcp" && proto != "udp" && proto != "sctp" && proto != "udplite" {
		return nil, fmt.Errorf("unsupported protocol in %q", m)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("bad port in %q", m)
	}
	return []string{ip.String() + "," + proto + ":" + strconv.Itoa(int(n)) + third}, nil
}

// canonIP returns the addresses m stands for in a hash:ip set: one plain
// address, or (IPv4 only, as ipset) every address of a prefix.
func (s *ipset) canonIP(m string) ([]string, error) {
	if !strings.Contains(m, "/") {
		a, err := netip.ParseAddr(m)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("bad ip %q", m)
		}
		if a.Is4() != (s.family == "inet") {
			return nil, fmt.Errorf("%s is not of family %s", a, s.family)
		}
		return []string{a.String()}, nil
	}
	p, err := parsePrefix(m)
	if err != nil || !p.Addr().Is4() || s.family != "inet" {
		return nil, fmt.Errorf("plain IP address must be supplied: %q", m)
	}
	if n := 1 << (32 - p.Bits()); n > s.maxelem {
		return nil, fmt.Errorf("%s has %d addresses: more than the set's maxelem %d", m, n, s.maxelem)
	}
	var out []string
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		out = append(out, a.String())
	}
	return out, nil
}

// protoNumbers are the protocols a hash:ip,port member may name by number.
var protoNumbers = map[string]string{"6": "tcp", "17": "udp", "132": "sctp", "136": "udplite"}

// sortedMembers returns s's members in a stable order.
func (s *ipset) sortedMembers() []string {
	out := make([]string, 0, len(s.members))
	for m := range s.members {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// ipsetRestore applies `ipset -exist restore` input to sets, line by line,
// as ipset does: the first failing line stops it. inUse reports whether a
// rule references a set (destroy refuses those).
func ipsetRestore(sets map[string]*ipset, data []byte, inUse func(string) bool) error {
	lineNo := 0
	for line := range strings.Lines(string(data)) {
		lineNo++
		if err := ipsetCommand(sets, strings.TrimSpace(line), true, inUse); err != nil {
			return fmt.Errorf("error in line %d (%q): %w", lineNo, strings.TrimSpace(line), err)
		}
	}
	return nil
}

func ipsetCommand(sets map[string]*ipset, line string, exist bool, inUse func(string) bool) error {
	if line == "" || strings.HasPrefix(line, "#") {
		return nil
	}
	var args []string
	for _, f := range strings.Fields(line) {
		if f == "-exist" || f == "-!" {
			exist = true
			continue
		}
		args = append(args, f)
	}
	if len(args) < 2 {
		return fmt.Errorf("incomplete command %q", line)
	}
	cmd, name := args[0], args[1]
	if len(name) > 31 {
		return fmt.Errorf("set name %q is longer than 31 characters", name)
	}
	s := sets[name]
	if s == nil && cmd == "destroy" && exist {
		return nil
	}
	if s == nil && cmd != "create" {
		return fmt.Errorf("%w: %s", ErrNoSet, name)
	}
	switch cmd {
	case "create":
		n, err := parseCreate(args[2:])
		if err != nil {
			return err
		}
		if s != nil {
			if !exist || !s.sameParams(n) {
				return fmt.Errorf("set %s cannot be created: set with the same name already exists", name)
			}
			return nil
		}
		sets[name] = n
	case "add", "del":
		if len(args) != 3 {
			return fmt.Errorf("%s needs exactly one element", cmd)
		}
		ms, err := s.canon(args[2])
		if err != nil {
			return err
		}
		for _, m := range ms {
			_, has := s.members[m]
			switch {
			case cmd == "add" && has && !exist:
				return fmt.Errorf("element %s cannot be added to %s: it's already added", m, name)
			case cmd == "add" && !has && len(s.members) >= s.maxelem:
				return fmt.Errorf("set %s is full", name)
			case cmd == "add":
				s.members[m] = struct{}{}
			case !has && !exist:
				return fmt.Errorf("element %s cannot be deleted from %s: it's not added", m, name)
			default:
				delete(s.members, m)
			}
		}
	case "flush":
		clear(s.members)
	case "swap":
		if len(args) != 3 {
			return errors.New("swap needs two sets")
		}
		o := sets[args[2]]
		if o == nil {
			return fmt.Errorf("%w: %s", ErrNoSet, args[2])
		}
		if !s.compatible(o) {
			return fmt.Errorf("sets %s and %s are not compatible", name, args[2])
		}
		sets[name], sets[args[2]] = o, s
	case "destroy":
		if inUse != nil && inUse(name) {
			return fmt.Errorf("%w: %s", ErrSetInUse, name)
		}
		delete(sets, name)
	default:
		return fmt.Errorf("unsupported command %q", cmd)
	}
	return nil
}
