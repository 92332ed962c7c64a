//go:build !linux

package cudaipc_test

func enterMDWE() {}
