package callback

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// AllowPrivate lists the address classes a dispatcher may deliver to,
// which it refuses by default.
type AllowPrivate struct {
	// Loopback allows 127.0.0.0/8 and ::1 (tests, a receiver on the same
	// host).
	Loopback bool
	// Private allows RFC 1918 and unique-local (fc00::/7) addresses, and
	// the shared address space 100.64.0.0/10.
	Private bool
	// LinkLocal allows 169.254.0.0/16 and fe80::/10. Cloud metadata
	// services live there: allow it only when you mean it.
	LinkLocal bool
	// Prefixes are further prefixes allowed whatever their class.
	Prefixes []netip.Prefix
}

// errForbiddenTarget is matched by the error of a dial the SSRF guard
// refused.
var errForbiddenTarget = errors.New("callback target address is not allowed")

var sharedSpace = netip.MustParsePrefix("100.64.0.0/10")

// check refuses addr unless its class is allowed.
func (a AllowPrivate) check(addr netip.Addr) error {
	addr = addr.Unmap()
	for _, p := range a.Prefixes {
		if p.Contains(addr) {
			return nil
		}
	}
	var class string
	switch {
	case addr.IsLoopback():
		if a.Loopback {
			return nil
		}
		class = "loopback"
	case addr.IsPrivate() || sharedSpace.Contains(addr):
		if a.Private {
			return nil
		}
		class = "private"
	case addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast():
		if a.LinkLocal {
			return nil
		}
		class = "link-local"
	case addr.IsUnspecified() || addr.IsMulticast() || addr.IsInterfaceLocalMulticast():
		class = "unspecified or multicast"
	default:
		return nil
	}
	return fmt.Errorf("%s address %s: %w", class, addr, errForbiddenTarget)
}

// control is a net.Dialer Control function: it runs on the address being
// dialled, after name resolution.
func (a AllowPrivate) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, err)
	}
	return a.check(ap.Addr())
}

// dialer returns a dialer guarded by a.
func (a AllowPrivate) dialer() *net.Dialer {
	return &net.Dialer{Control: a.control}
}
