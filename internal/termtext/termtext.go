// Package termtext makes text that came from elsewhere (business keys,
// error texts of handlers, operators' reasons) safe to show in a terminal.
//
// A terminal acts on control characters instead of showing them: an escape
// sequence can recolour, move the cursor or rewrite what is on screen, and
// a carriage return or line feed inside a table cell can forge rows. Escape
// writes them as Go escapes (\x1b, \r, \u2028), so the text prints as one
// line that says what it holds.
package termtext

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// IsControl reports whether a terminal may act on r rather than show it:
// the C0 controls (below U+0020, tab and line feed included), DEL, the C1
// controls (U+0080 to U+009F) and the line and paragraph separators
// U+2028 and U+2029.
func IsControl(r rune) bool {
	return r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == '\u2028' || r == '\u2029'
}

// IsBidiControl reports whether r is one of the invisible characters that
// reorder the text around them (the bidirectional embeddings, overrides,
// isolates and marks): shown as they are, they make a table cell read as
// something else than it holds.
func IsBidiControl(r rune) bool {
	return (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c
}

// escaped reports whether Escape writes r as an escape.
func escaped(r rune) bool { return IsControl(r) || IsBidiControl(r) }

// Escape returns s with every control character (IsControl) and
// bidirectional control (IsBidiControl) written as its Go escape and every
// byte that is not UTF-8 as \xNN; other text, including backslashes, is
// left as it is.
func Escape(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, escaped) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case IsControl(r):
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u2028'
			b.WriteString(q[1 : len(q)-1])
		case IsBidiControl(r): // printable to strconv, so quoted by hand
			b.WriteString(`\u`)
			b.WriteString(strconv.FormatUint(uint64(r)|0x10000, 16)[1:])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
