// Command travel runs the whole travel example — the Book Trip saga, its
// participants and the itinerary subscriber — as one service (runtime/host;
// configuration from the environment, see `go doc
// github.com/protosaga/saga/runtime/host`).
package main

import (
	"github.com/protosaga/saga/examples/travel/app"
	"github.com/protosaga/saga/runtime/host"
)

func main() {
	host.Main(func(h *host.Host) error {
		_, err := app.Register(h)
		return err
	})
}
