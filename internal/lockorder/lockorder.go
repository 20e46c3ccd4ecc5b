// Package lockorder checks that a program takes its locks in the order it
// declares. Its Mutex and RWMutex are sync's, named by a class: a type
// parameter, one empty struct type per lock field. In a build with the
// lockorder tag, every lock taken is checked against the locks its
// goroutine holds, and one taken out of the declared order ends the
// program, naming both; without the tag, they are sync's types, at no
// cost.
//
// The order is declared with Order, by class names as reflect prints
// them (package.type): a lock may be taken while holding another only
// when a chain declares the held one first (or it is an Outer class).
// Every other lock is a leaf: no lock is taken while holding it.
//
// The check serializes lock calls through a lock of its own, which would
// hide data races from the race detector: run it in a build of its own,
// such as go test -tags lockorder.
package lockorder

import (
	"reflect"
	"strings"
	"sync"
)

// Order declares chains of classes: in each, a class may be held while
// the ones after it are taken. It returns true, for use in a package-level
// var declaration.
func Order(chains ...string) bool {
	decl.mu.Lock()
	defer decl.mu.Unlock()
	for _, c := range chains {
		names := strings.Fields(strings.ReplaceAll(c, "<", " "))
		for i, a := range names {
			for _, b := range names[i+1:] {
				decl.before[[2]string{a, b}] = true
			}
		}
	}
	return true
}

// Outer declares classes that may be held while any lock is taken: locks
// held across a whole piece of work, such as a sync run.
func Outer(classes ...string) bool {
	decl.mu.Lock()
	defer decl.mu.Unlock()
	for _, c := range classes {
		decl.outer[c] = true
	}
	return true
}

var decl = struct {
	mu     sync.RWMutex
	before map[[2]string]bool
	outer  map[string]bool
}{before: make(map[[2]string]bool), outer: make(map[string]bool)}

// allowed reports whether a lock of class next may be taken while one of
// class held is held.
func allowed(held, next string) bool {
	decl.mu.RLock()
	defer decl.mu.RUnlock()
	return decl.outer[held] || decl.before[[2]string{held, next}]
}

// className returns the name of class C, as Order takes it.
func className[C any]() string { return reflect.TypeFor[C]().String() }
