package model

import "testing"

// TestSuggest: a misspelt name gets the closest candidate within a quarter
// of its length; an unrelated name, or one only its own candidate matches,
// gets none.
func TestSuggest(t *testing.T) {
	t.Parallel()
	groups := []string{"Assess", "ReserveTrip"}
	for _, c := range []struct{ name, want string }{
		{"Asess", "Assess"},
		{"ReserveTirp", "ReserveTrip"},
		{"reservetrip", "ReserveTrip"},
		{"Billing", ""},
		{"Assess", ""},
		{"claims.fraud.v1.FraudScren", "claims.fraud.v1.FraudScreen"},
	} {
		if got := suggest(c.name, append(groups, "claims.fraud.v1.FraudScreen")); got != c.want {
			t.Errorf("suggest(%q) = %q, want %q", c.name, got, c.want)
		}
	}
	if got := editDistance("kitten", "sitting"); got != 3 {
		t.Errorf("editDistance(kitten, sitting) = %d, want 3", got)
	}
	if got := didYouMean("Asess", groups, "declare it"); got != `did you mean "Assess"? Otherwise declare it` {
		t.Errorf("didYouMean = %q", got)
	}
}
