package model

import "testing"

func TestRuleRoundTrip(t *testing.T) {
	for _, spec := range []string{
		"-m mark --mark 0x80000/0x80000 -j RETURN",
		"-d 10.96.0.53/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 40053",
		"-p tcp -m addrtype --dst-type LOCAL -m set --match-set a dst -m set --match-set b dst -j REJECT --reject-with tcp-reset",
		"! -d 10.0.0.0/8 -m set ! --match-set a dst,dst -m comment --comment \"a \\\"quoted\\\" comment\" -j ACCEPT",
		"-s 10.0.0.0/8 -i eth0 -j SVCPROXY-X",
		"-m conntrack --ctstate NEW,DNAT -j RETURN",
		"-m addrtype --src-type LOCAL -j SVCPROXY-X",
		"-m addrtype ! --src-type LOCAL --dst-type LOCAL -j RETURN",
		"-d 10.0.0.1/32 -p tcp -m tcp --dport 80 -g SVCPROXY-X",
	} {
		r, err := parseRule(spec, IPv4)
		if err != nil {
			t.Errorf("parseRule(%q): %v", spec, err)
			continue
		}
		again, err := parseRule(r.String(), IPv4)
		if err != nil || again.String() != r.String() {
			t.Errorf("round trip of %q: %q then %q (%v)", spec, r.String(), again, err)
		}
	}
	// Spellings iptables-save may use mean the same rule.
	for _, same := range [][2]string{
		{"-p udp --dport 53 -d 10.0.0.1 -j RETURN", "-d 10.0.0.1/32 -p udp -m udp --dport 53 -j RETURN"},
		{"-p 132 --dport 3868 -d 10.0.0.1 -j RETURN", "-d 10.0.0.1/32 -p sctp -m sctp --dport 3868 -j RETURN"},
		{"-m addrtype --dst-type LOCAL --src-type LOCAL --goto X", "-m addrtype --src-type LOCAL --dst-type LOCAL -g X"},
	} {
		a, errA := parseRule(same[0], IPv4)
		b, errB := parseRule(same[1], IPv4)
		if errA != nil || errB != nil || a.String() != b.String() {
			t.Errorf("%q != %q (%v, %v)", a, b, errA, errB)
		}
	}
	if _, err := parseRule("-p tcp --dport", IPv4); err == nil {
		t.Error("a dangling option parsed")
	}
}
