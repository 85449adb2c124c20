// Package helpertest is a test helper package of the fixture kernelpkg:
// its NewEnv reaches cgrouptest.Kernel, its Logic does not. It is never
// built.
package helpertest

import "testing"

type Env struct{}

func NewEnv(t *testing.T) *Env { cgrouptest.Kernel(t); return &Env{} }

func (e *Env) Start() {}

func Logic(t *testing.T) { t.Log("no kernel") }

func TestNotATest(t *testing.T) { cgrouptest.Kernel(t) }
