package host

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Main runs a service from the environment: it reads the configuration with
// [FromEnv], builds the host, calls register to add the service's
// participants and sagas (the generated Register functions), and runs until
// SIGINT or SIGTERM, then stops in order. It exits the process with status 1
// (and the reason on standard error) when anything fails, 0 after a clean
// stop. A service's main is one call:
//
//	func main() {
//		host.Main(func(h *host.Host) error {
//			return inventoryv1.RegisterInventoryParticipant(h, inventory{})
//		})
//	}
func Main(register func(*Host) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := MainContext(ctx, os.Getenv, register); err != nil {
		fmt.Fprintln(os.Stderr, err)
		stop()
		os.Exit(1)
	}
}

// MainContext is [Main] without the process around it: configuration through
// getenv, until ctx ends; it returns what Main would print.
func MainContext(ctx context.Context, getenv func(string) string, register func(*Host) error) error {
	cfg, err := FromEnv(getenv)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	h, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	if err := register(h); err != nil {
		h.Close()
		return fmt.Errorf("host %s: register: %w", h.cfg.Service, err)
	}
	return h.Run(ctx)
}
