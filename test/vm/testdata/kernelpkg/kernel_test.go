// Package kernelpkg is the fixture of TestKernelTests: which of its tests
// reach cgrouptest.Kernel. It is never built.
package kernelpkg

import (
	"testing"

	"github.com/cpuslot/cpuslot/test/vm/testdata/helpertest"
)

func TestDirect(t *testing.T) { cgrouptest.Kernel(t) }

func TestThroughHelper(t *testing.T) { newEnv(t).start() }

func TestThroughMethod(t *testing.T) {
	var e env
	t.Run("sub", func(t *testing.T) { e.prepare(t) })
}

func TestHelperAsValue(t *testing.T) { t.Run("sub", useKernel) }

func TestLogicOnly(t *testing.T) { helperWithoutKernel(t) }

func TestThroughHelperPackage(t *testing.T) { helpertest.NewEnv(t).Start() }

func TestHelperPackageLogicOnly(t *testing.T) { helpertest.Logic(t) }

func TestMain(m *testing.M) { cgrouptest.Kernel(nil) }

type env struct{}

func newEnv(t *testing.T) *env { deeper(t); return &env{} }

func deeper(t *testing.T) { cgrouptest.Kernel(t) }

func (e *env) start() {}

func (e *env) prepare(t *testing.T) { deeper(t) }

func useKernel(t *testing.T) { cgrouptest.Kernel(t) }

func helperWithoutKernel(t *testing.T) { t.Log("no kernel") }
