package gateway

import "runtime"

func runtimeGosched() { runtime.Gosched() }
