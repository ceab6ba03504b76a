// Package kerneltest is the scaffolding the tests of the packages at the
// kernel boundary (netfilter, redirect, kernelmodes/...) share, so that each
// writes only what it asserts:
//
//   - Gate: the privileged tests' precondition (root, the tools on PATH, a
//     probe in a throwaway namespace), checked once per package, and the
//     throwaway namespaces those tests work in (NewNS), deleted when the
//     test ends. Tests touch only namespaces they create, never the
//     caller's: tools run through `ip netns exec`, sockets are made on a
//     thread moved into the namespace (Do, Dial).
//   - Variants: the iptables backends to run against (the one on PATH and
//     legacy, when installed); State: a namespace's tables and sets as text
//     to compare before and after.
//   - Input: fuzz input decoded into Services from small pools, so they
//     collide on frontends, NodePorts and node addresses; Destinations: the
//     addresses worth tracing for them.
//   - ScaleServices: the many-Services fixture of the scale tests and
//     benchmarks; Median and Ms for their figures.
//   - ShortCircuit: the real traffic of externalTrafficPolicy Local's
//     short circuit (pods, the node, a client outside), the same cases
//     for every kernel mode that has it.
//
// It must not import netfilter: netfilter's own tests use it.
package kerneltest
