// Command etcd is etcd's own server, built from its published module so
// that the tests' API server has a store without a system package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
