// Command library runs the library's services and the Lend Book saga.
package main

import (
	"example.com/library/internal/library"

	"github.com/protosaga/saga/runtime/host"
)

func main() {
	host.Main(library.Register)
}
