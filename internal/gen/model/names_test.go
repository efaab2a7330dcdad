package model

import "testing"

// TestLower: only a leading letter changes; '_', digits and non-ASCII
// letters never become other bytes (s[0]|0x20 turned '_' into DEL).
func TestLower(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":           "",
		"PlaceOrder": "placeOrder",
		"place":      "place",
		"_":          "_",
		"_Order":     "_Order",
		"9Lives":     "9Lives",
		"ÄOrder":     "äOrder",
	} {
		if got := Lower(in); got != want {
			t.Errorf("Lower(%q) = %q, want %q", in, got, want)
		}
	}
}
