// Command registry is distribution's container registry (its `registry` command's root command,
// `registry serve CONFIG`), built from its module for the tests with the filesystem storage
// driver only: the cloud drivers of the upstream command are not needed on loopback.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
