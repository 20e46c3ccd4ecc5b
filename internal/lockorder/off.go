//go:build !lockorder

package lockorder

import "sync"

// Mutex is a sync.Mutex of class C.
type Mutex[C any] struct{ sync.Mutex }

// RWMutex is a sync.RWMutex of class C.
type RWMutex[C any] struct{ sync.RWMutex }

// Held records that a lock of class C, which is not a Mutex or RWMutex
// (a channel, say), is taken; Released that it is given back.
func Held[C any]() {}

// Released records that a lock of class C that Held recorded is given
// back.
func Released[C any]() {}
