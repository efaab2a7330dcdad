package model

import (
	"strings"
	"unicode"
)

// words splits a CamelCase or snake/kebab identifier into lower-case words,
// keeping acronyms together: "HTTPServerV2" → [http server v2].
func words(s string) []string {
	var out []string
	var cur []rune
	rs := []rune(s)
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	for i, r := range rs {
		switch {
		case r == '_' || r == '-' || r == '.' || r == ' ':
			flush()
			continue
		case unicode.IsUpper(r):
			prevLower := i > 0 && (unicode.IsLower(rs[i-1]) || unicode.IsDigit(rs[i-1]))
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			prevUpper := i > 0 && unicode.IsUpper(rs[i-1])
			if prevLower || (prevUpper && nextLower) {
				flush()
			}
		}
		cur = append(cur, r)
	}
	flush()
	return out
}

// Snake returns snake_case: "PlaceOrder" → "place_order".
func Snake(s string) string { return strings.Join(words(s), "_") }

// Kebab returns kebab-case: "PlaceOrder" → "place-order".
func Kebab(s string) string { return strings.Join(words(s), "-") }

// Camel returns an exported CamelCase Go name: "inventory-service" →
// "InventoryService". Acronyms inside CamelCase input are kept as written.
func Camel(s string) string {
	var b strings.Builder
	upNext := true
	for _, r := range s {
		if r == '_' || r == '-' || r == '.' || r == ' ' {
			upNext = true
			continue
		}
		if upNext {
			b.WriteRune(unicode.ToUpper(r))
			upNext = false
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
