package main

import (
	"fmt"
	"io"
	"os"
)

// secretEnv are the environment variables that carry secrets: API and
// bootstrap tokens, the appliance's management token, a PostgreSQL URL
// with its password.
var secretEnv = []string{"RIALTO_TOKEN", "RIALTO_TOKENS", "RIALTO_BOOTSTRAP_TOKEN", "RIALTO_ADMIN_TOKEN",
	"RIALTO_APPLIANCE_TOKEN", "RIALTO_DB"}

// withholdSecretEnv takes the secret variables out of this process's
// environment, so that no child inherits them (nft, qemu, PostgreSQL, a
// memory mapping's fault handler, …: none needs them), and returns the
// getenv of the verbs, which still sees them. A child that needs one (a
// replica, a VM's supervisor) is given it by name.
func withholdSecretEnv() func(string) string {
	kept := map[string]string{}
	for _, k := range secretEnv {
		if v, ok := os.LookupEnv(k); ok {
			kept[k] = v
			os.Unsetenv(k)
		}
	}
	return func(k string) string {
		if v, ok := kept[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
}

// readSecretFile reads a file holding a secret, refusing one that every
// user of the machine may read or write (a token in it is no longer a
// secret, and a writable one lets anyone swap it): group access is left
// to the operator (the control plane's token files are root:rialto 0640).
func readSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().IsRegular() && st.Mode().Perm()&0o006 != 0 {
		return nil, fmt.Errorf("%s holds a secret but every user of the machine may read or write it (mode %04o): chmod o-rwx %s", path, st.Mode().Perm(), path)
	}
	return io.ReadAll(io.LimitReader(f, maxInline))
}
