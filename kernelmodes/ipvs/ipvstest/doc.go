// Package ipvstest is an in-memory kernel for the IPVS mode's tests: a fake
// per boundary of kernelmodes/ipvs (IPVS, Links, Conntrack, Sysctls, and
// netfiltertest.Fake as its Rules), bundled in Fakes, and a packet tracer that
// follows a packet through the rules and IPVS as the kernel would.
package ipvstest
