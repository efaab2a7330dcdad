// Command quoteapproval runs the Quote Approval example as one service: the
// pricing and ordering participants and the saga on one host, configured from
// the environment (SAGA_PG_URL, SAGA_AMQP_URL, SAGA_HTTP_ADDR, ...; see
// runtime/host).
package main

import (
	"github.com/protosaga/saga/examples/quoteapproval/app"
	"github.com/protosaga/saga/runtime/host"
)

func main() {
	host.Main(func(h *host.Host) error {
		_, err := app.Register(h)
		return err
	})
}
