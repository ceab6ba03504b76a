// Package source holds the inputs that feed lb.Store: a static services file
// (source/file) and, later, Kubernetes (source/kube).
package source
