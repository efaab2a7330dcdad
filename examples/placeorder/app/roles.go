package app

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Role is a part of the application that one process can run. A process
// runs the roles in Config.Roles; the whole application is any set of
// processes whose roles together cover AllRoles, and every role may run in
// several processes at once (relays lease outbox rows with SKIP LOCKED,
// consumers share their queue, timeout scanners claim due instances with
// SKIP LOCKED).
type Role string

// The application's roles.
const (
	// RoleRelay runs Config.Relays outbox relays.
	RoleRelay Role = "relay"
	// RoleOrchestrator runs the saga: the consumer of its reply queue and
	// its timeout scanner.
	RoleOrchestrator Role = "orchestrator"
	// RoleInventory, RolePayment, RoleShipping and RoleOrder run the
	// consumer of one participant service's command queue.
	RoleInventory Role = "inventory"
	RolePayment   Role = "payment"
	RoleShipping  Role = "shipping"
	RoleOrder     Role = "order"
)

// AllRoles returns every role, in a fixed order.
func AllRoles() []Role {
	return []Role{RoleRelay, RoleOrchestrator, RoleInventory, RolePayment, RoleShipping, RoleOrder}
}

// ParticipantRoles returns the roles of the four participant services.
func ParticipantRoles() []Role {
	return []Role{RoleInventory, RolePayment, RoleShipping, RoleOrder}
}

// ParseRoles parses a comma-separated list of roles ("relay,orchestrator");
// "all" stands for AllRoles and "participants" for ParticipantRoles.
// Duplicates are dropped; an unknown name is an error.
func ParseRoles(s string) ([]Role, error) {
	var out []Role
	add := func(r Role) {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for part := range strings.SplitSeq(s, ",") {
		name := strings.TrimSpace(part)
		switch name {
		case "":
			continue
		case "all":
			for _, r := range AllRoles() {
				add(r)
			}
			continue
		case "participants":
			for _, r := range ParticipantRoles() {
				add(r)
			}
			continue
		}
		r := Role(name)
		if !slices.Contains(AllRoles(), r) {
			return nil, fmt.Errorf("unknown role %q (want one of %v, all or participants)", name, AllRoles())
		}
		add(r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no roles in %q", s)
	}
	return out, nil
}

// has reports whether the configured roles include r.
func (c *Config) has(r Role) bool { return slices.Contains(c.Roles, r) }

// part tells the crash points which part of the application a database call
// comes from; App.Run puts it in each part's context.
type part int

const (
	partNone part = iota
	partRelay
	partConsumer
	partScanner
)

type partKey struct{}

func withPart(ctx context.Context, p part) context.Context {
	return context.WithValue(ctx, partKey{}, p)
}

func partOf(ctx context.Context) part {
	p, _ := ctx.Value(partKey{}).(part)
	return p
}
